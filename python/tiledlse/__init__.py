"""TiledLSE for PyTorch: log-sum-exp losses (cut cross-entropy, CLIP and SimCLR contrastive
losses, distillation's KL and JSD) over implicit matrices, without materializing the logits.
Pure Python over the C library libtiledlse_c (ctypes); see docs/python.md."""
from ._functions import (CrossEntropyOutput, contrastive_loss, distillation_loss, linear_cross_entropy,
                         self_contrastive_loss)
from .causal_lm import causal_lm_distillation_loss, causal_lm_loss
from . import transformers  # tiledlse.transformers.apply(model); imports transformers only when used
from ._library import TiledLSEError, library_path, version as __version__

import torch.distributed as _dist

if _dist.is_available():  # tiledlse.distributed: the losses over a torch.distributed process group
    from . import distributed

__all__ = ["linear_cross_entropy", "CrossEntropyOutput", "contrastive_loss", "self_contrastive_loss", "causal_lm_loss",
           "distillation_loss", "causal_lm_distillation_loss",
           "transformers", "TiledLSEError",
           "library_path", "__version__"]
