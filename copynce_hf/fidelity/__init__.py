"""Checks of this package against the authors' own CopyNCE code (``scripts/check_against_authors.py``).

* :mod:`.standins` -- the few names the authors' model and loss files import from timm, torchvision
  and kornia, written from those libraries' documented behaviour, so that their code imports beside
  this package's CPU torch (where torchvision cannot be installed);
* :mod:`.oracle` -- builds their descriptor and matcher from their default configurations with
  seeded random weights, converts them with :mod:`copynce_hf.authors_checkpoints` and compares the
  outputs, the preprocessing and the losses.
"""
