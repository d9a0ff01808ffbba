"""Training objectives of CopyNCE: CopyNCE, InfoNCE, KoLeo, BCE and the affinity entropy.

The implementation lives in :mod:`copynce_hf.modeling.losses_copynce`, inside the modelling
package, so that a model folder written by ``save_pretrained`` carries it (Hub custom code);
this module is the package-level name for the same functions.
"""

from .modeling.losses_copynce import *  # noqa: F401,F403
from .modeling.losses_copynce import __all__  # noqa: F401
