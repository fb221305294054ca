"""``kiln.autograd``: the public face of ``kiln.frontend.autograd``, and ``kiln.autograd.functional``
(jacobian, hessian, vjp, jvp, hvp, vhp)."""

from ..frontend.autograd import *  # noqa: F403
from ..frontend.autograd import __all__ as _frontend_all
from . import functional

__all__ = [*_frontend_all, "functional"]
