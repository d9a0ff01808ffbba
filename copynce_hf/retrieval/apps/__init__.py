"""Layer 3 of retrieval: what a user runs: matcher re-scoring, ``detect``, ``dedup`` and calibration files.
Imports :mod:`..search` and :mod:`..jobs`."""
