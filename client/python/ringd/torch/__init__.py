"""ringd.torch - the PyTorch layer over ringd's shared buffers."""
import torch  # noqa: F401  (the layer needs torch; ringd alone does not)
