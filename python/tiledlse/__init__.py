"""TiledLSE for PyTorch: log-sum-exp losses (cut cross-entropy, CLIP contrastive loss) over
implicit matrices, without materializing the logits. Pure Python over the C library
libtiledlse_c (ctypes); see docs/python.md."""
from ._functions import contrastive_loss, linear_cross_entropy
from ._library import TiledLSEError, library_path, version as __version__

__all__ = ["linear_cross_entropy", "contrastive_loss", "TiledLSEError", "library_path", "__version__"]
