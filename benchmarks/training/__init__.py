"""What does training buy, and which model ships?

* :mod:`.train`: baseline and CopyNCE descriptors (and matchers) trained with identical budgets.
* :mod:`.scaling`: the compute-scaling curve (mini-DISC quality at 1x, 2x, 4x ... the budget).
* :mod:`.gpu`: the embedded models continued on a lent GPU, in one device call.
* :mod:`.held_out`, :mod:`.held_out_templates`: the export rule, on held-out photos only (several draws of
  copies; template collections).
"""
