"""Settings dataclasses whose fields declare their own command-line options (:mod:`.fields`)."""
