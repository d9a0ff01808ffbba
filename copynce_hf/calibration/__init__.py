"""Score thresholds for a stated precision: the calibration file, and the calibrations that make it (planted copies of
a collection's references for ``detect``, the collection itself for ``dedup``)."""
