"""``kiln.autograd``: the public face of ``kiln.frontend.autograd``."""

from .frontend.autograd import *  # noqa: F403
from .frontend.autograd import __all__  # noqa: F401
