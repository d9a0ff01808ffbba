"""Settings declared on dataclass fields: the options a field declares (:mod:`.fields`) and the checks of its value
(:mod:`.field_checks`), shared by the commands and the training run."""
