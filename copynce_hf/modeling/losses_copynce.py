"""The training objectives, as :mod:`modeling_copynce` imports them.

Inside the package this module only re-exports :mod:`copynce_hf.losses` (the single
implementation). A saved model folder must run without ``copynce_hf``, so
``CopyNCEPreTrainedModel.save_pretrained`` replaces the copy of this file that
``transformers`` writes into the folder by the source of ``copynce_hf/losses.py`` itself
(plus the package files it imports relatively, such as ``errors.py``): the folder then
carries the real loss code under this module's name.
"""

from copynce_hf.errors import CopyNCEError
from copynce_hf.losses import (
    affinity_entropy,
    copy_bce_loss,
    copynce_loss,
    info_nce_loss,
    koleo_loss,
    paired_koleo_loss,
)

__all__ = ["CopyNCEError", "affinity_entropy", "copy_bce_loss", "copynce_loss", "info_nce_loss", "koleo_loss",
           "paired_koleo_loss"]
