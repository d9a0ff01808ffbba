"""How well are copies found? Quality on mini-DISC and on planted copies, measured with the project's metric.

* :mod:`.systems`: every system (PDQ, pHash, descriptors, matchers, the detection pipeline) on mini-DISC.
* :mod:`.calibration`: thresholds calibrated on the references alone, applied to the real queries.
* :mod:`.dedup`: ``copynce dedup``'s pair precision and recall on a collection with planted copies.
"""
