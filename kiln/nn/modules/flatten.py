"""``torch.nn.modules.flatten``'s path: ``Flatten`` and ``Unflatten`` (defined in misc.py)."""

from .misc import Flatten, Unflatten

__all__ = ["Flatten", "Unflatten"]
