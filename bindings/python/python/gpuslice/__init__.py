"""gpuslice: GPU and vGPU discovery, health and placement for virtual machines."""

from ._native import __version__

__all__ = ["__version__"]
