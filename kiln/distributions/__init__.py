"""``kiln.distributions``: probability distributions as ``torch.distributions`` has them.

Normal, Uniform (reparametrized: ``rsample`` is differentiable in the parameters), Bernoulli and
Categorical (by ``probs`` or ``logits``), Independent and MultivariateNormal, with ``sample``, ``log_prob``, ``entropy``, ``cdf``
where it exists, moments, ``batch_shape``/``event_shape`` and ``expand``; ``kl_divergence``
between the pairs that have a closed form. Draws come from kiln's generator, so
``kiln.manual_seed`` makes them reproducible. Arguments and ``log_prob`` values are validated
as in PyTorch (``Distribution.set_default_validate_args(False)`` turns that off); a check is a
node of a compiled program, as index ranges are, so validating never stops a trace.

>>> import kiln
>>> from kiln.distributions import Normal, kl_divergence
>>> kl_divergence(Normal(0.0, 1.0), Normal(1.0, 1.0))
tensor(0.5000)
"""

from . import constraints
from .bernoulli import Bernoulli
from .categorical import Categorical
from .distribution import Distribution
from .independent import Independent
from .kl import kl_divergence, register_kl
from .multivariate_normal import MultivariateNormal
from .normal import Normal
from .uniform import Uniform

__all__ = [
    "Distribution",
    "Normal",
    "Uniform",
    "Bernoulli",
    "Categorical",
    "kl_divergence",
    "register_kl",
    "constraints",
]
