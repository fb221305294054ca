"""kiln.distributions against torch.distributions: densities, entropies, moments, shapes, KL,
validation; sample statistics at N = 100k; rsample gradients against finite differences."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
from kiln import distributions as D
from tests.conftest import assert_close

rng = np.random.default_rng(0)
TOL = {"rtol": 1e-6, "atol": 1e-6}


def pair(torch, array, dtype=np.float32):
    a = np.asarray(array, dtype=dtype)
    return kiln.from_numpy(a.copy()), torch.from_numpy(a.copy())


def constructors(torch):
    """(name, kiln distribution, torch distribution, values to score (kiln, torch))."""
    loc, tloc = pair(torch, rng.normal(size=(2, 3)))
    scale, tscale = pair(torch, rng.uniform(0.5, 2.0, size=(3,)))
    x, tx = pair(torch, rng.normal(size=(4, 2, 3)))
    low, tlow = pair(torch, rng.normal(size=(3,)))
    high, thigh = pair(torch, rng.normal(size=(3,)) + 3)
    u, tu = pair(torch, rng.uniform(-1, 2, size=(5, 3)))
    p, tp = pair(torch, rng.uniform(0.05, 0.95, size=(2, 3)))
    b, tb = pair(torch, rng.integers(0, 2, size=(4, 2, 3)))
    logits, tlogits = pair(torch, rng.normal(size=(2, 4)))
    probs, tprobs = pair(torch, rng.uniform(0, 1, size=(3, 4)))
    k = rng.integers(0, 4, size=(5, 2))
    kk, tk = kiln.from_numpy(k), torch.from_numpy(k)
    TD = torch.distributions
    return [
        ("normal", D.Normal(loc, scale), TD.Normal(tloc, tscale), (x, tx)),
        ("normal-numbers", D.Normal(0.5, 2.0), TD.Normal(0.5, 2.0), (x, tx)),
        ("uniform", D.Uniform(low, high), TD.Uniform(tlow, thigh), (u, tu)),
        ("bernoulli-probs", D.Bernoulli(probs=p), TD.Bernoulli(probs=tp), (b, tb)),
        ("bernoulli-logits", D.Bernoulli(logits=loc), TD.Bernoulli(logits=tloc), (b, tb)),
        ("categorical-logits", D.Categorical(logits=logits), TD.Categorical(logits=tlogits), (kk, tk)),
        ("categorical-probs", D.Categorical(probs=kiln.cat([probs[:, :3], kiln.zeros(3, 1)], 1)),
         TD.Categorical(probs=torch.cat([tprobs[:, :3], torch.zeros(3, 1)], 1)),
         (kiln.from_numpy(k[:, :1] % 3), torch.from_numpy(k[:, :1] % 3))),
    ]  # fmt: skip


def test_log_prob_entropy_moments_and_shapes_match_torch(torch):
    for name, d, td, (value, tvalue) in constructors(torch):
        assert tuple(d.batch_shape) == tuple(td.batch_shape) and tuple(d.event_shape) == tuple(td.event_shape), name
        if name == "uniform":  # values outside the support score -inf, as torch with validate_args off
            td = torch.distributions.Uniform(td.low, td.high, validate_args=False)
            d = D.Uniform(d.low, d.high, validate_args=False)
        assert_close(d.log_prob(value), td.log_prob(tvalue), **TOL)
        assert_close(d.entropy(), td.entropy(), **TOL)
        for moment in ("mean", "variance", "stddev"):
            assert_close(getattr(d, moment), getattr(td, moment), **TOL)
        assert d.sample().shape == td.sample().shape, name
        assert d.sample((5, 2)).shape == td.sample((5, 2)).shape, name
        expanded, texpanded = d.expand((7,) + tuple(d.batch_shape)), td.expand((7,) + tuple(td.batch_shape))
        assert tuple(expanded.batch_shape) == tuple(texpanded.batch_shape), name
        assert_close(expanded.entropy(), texpanded.entropy(), **TOL)


def test_cdf_and_icdf_match_torch(torch):
    loc, tloc = pair(torch, rng.normal(size=3), np.float64)
    x, tx = pair(torch, rng.normal(size=(2, 3)), np.float64)
    q, tq = pair(torch, rng.uniform(0.01, 0.99, size=(2, 3)), np.float64)
    n, tn = D.Normal(loc, 1.5), torch.distributions.Normal(tloc, 1.5)
    assert_close(n.cdf(x), tn.cdf(tx), rtol=1e-12, atol=1e-14)
    assert_close(n.icdf(q), tn.icdf(tq), rtol=1e-12, atol=1e-14)
    u, tu = D.Uniform(loc, loc + 2), torch.distributions.Uniform(tloc, tloc + 2)
    assert_close(
        u.cdf(x.clamp(-0.99, 0.99) + loc + 1), tu.cdf(tx.clamp(-0.99, 0.99) + tloc + 1), rtol=1e-12, atol=1e-14
    )
    assert_close(u.icdf(q), tu.icdf(tq), rtol=1e-12, atol=1e-14)


def test_kl_divergence_matches_torch(torch):
    TD = torch.distributions
    a, ta = pair(torch, rng.normal(size=(2, 4)))
    b, tb = pair(torch, rng.normal(size=(4,)))
    s, ts = pair(torch, rng.uniform(0.5, 2, size=(2, 4)))
    p, tp = pair(torch, [[0.2, 0.3, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q, tq = pair(torch, [[0.1, 0.0, 0.6, 0.3], [0.4, 0.3, 0.2, 0.1]])  # torch's categorical KL needs one batch shape
    c, tc = pair(torch, rng.normal(size=(2, 4)))
    cases = [
        (D.Normal(a, s), D.Normal(b, 1.0), TD.Normal(ta, ts), TD.Normal(tb, 1.0)),
        (D.Categorical(logits=a), D.Categorical(logits=c), TD.Categorical(logits=ta), TD.Categorical(logits=tc)),
        (D.Categorical(probs=p), D.Categorical(probs=q), TD.Categorical(probs=tp), TD.Categorical(probs=tq)),
        (D.Bernoulli(logits=a), D.Bernoulli(logits=c), TD.Bernoulli(logits=ta), TD.Bernoulli(logits=tc)),
        (D.Uniform(b, b + 1), D.Uniform(b - 1, b + 3), TD.Uniform(tb, tb + 1), TD.Uniform(tb - 1, tb + 3)),
        (D.Uniform(b, b + 1), D.Normal(a, s), TD.Uniform(tb, tb + 1), TD.Normal(ta, ts)),
    ]
    for kp, kq, tp_, tq_ in cases:
        assert_close(D.kl_divergence(kp, kq), torch.distributions.kl_divergence(tp_, tq_), **TOL)
    with pytest.raises(NotImplementedError, match="No KL"):
        D.kl_divergence(D.Normal(0.0, 1.0), D.Bernoulli(probs=kiln.tensor(0.5)))


def test_sample_statistics_at_100k():
    kiln.manual_seed(0)
    n = 100_000
    normal = D.Normal(kiln.tensor([1.0, -2.0]), kiln.tensor([0.5, 3.0]))
    x = normal.sample((n,))
    for mean, expected, sd in zip(x.mean(0).numpy(), [1.0, -2.0], [0.5, 3.0], strict=True):
        assert abs(mean - expected) < 4 * sd / math.sqrt(n)  # four standard errors
    np.testing.assert_allclose(x.var(0).numpy(), [0.25, 9.0], rtol=0.03)
    u = D.Uniform(kiln.tensor(-1.0), kiln.tensor(3.0)).sample((n,))
    assert float(u.min()) >= -1.0 and float(u.max()) < 3.0
    np.testing.assert_allclose([float(u.mean()), float(u.var())], [1.0, 16 / 12], rtol=0.02, atol=0.02)
    b = D.Bernoulli(probs=kiln.tensor([0.1, 0.7])).sample((n,))
    assert set(np.unique(b.numpy())) <= {0.0, 1.0} and b.dtype == kiln.float32
    np.testing.assert_allclose(b.mean(0).numpy(), [0.1, 0.7], atol=0.01)
    probs = np.array([0.1, 0.2, 0.0, 0.7])
    c = D.Categorical(probs=kiln.from_numpy(probs.astype(np.float32))).sample((n,))
    assert c.dtype == kiln.int64
    np.testing.assert_allclose(np.bincount(c.numpy(), minlength=4) / n, probs, atol=0.01)
    batched = D.Categorical(logits=kiln.tensor([[0.0, 5.0], [5.0, 0.0]])).sample((1000,))
    assert batched.shape == (1000, 2)
    assert float(batched[:, 0].float().mean()) > 0.95 and float(batched[:, 1].float().mean()) < 0.05


def test_sampling_is_reproducible_with_manual_seed():
    d = D.Normal(kiln.zeros(3), kiln.ones(3))
    kiln.manual_seed(7)
    first = (
        d.sample((2,)),
        D.Categorical(logits=kiln.zeros(5)).sample((4,)),
        D.Bernoulli(probs=kiln.tensor(0.5)).sample((6,)),
    )
    kiln.manual_seed(7)
    second = (
        d.sample((2,)),
        D.Categorical(logits=kiln.zeros(5)).sample((4,)),
        D.Bernoulli(probs=kiln.tensor(0.5)).sample((6,)),
    )
    for a, b in zip(first, second, strict=True):
        assert_close(a, b, rtol=0, atol=0)


def test_rsample_gradients_match_finite_differences():
    # with the noise fixed by the seed, rsample is a smooth function of the parameters
    def draw(dist_type):
        def fn(a, b):
            kiln.manual_seed(3)
            return dist_type(a, b).rsample((4,))

        return fn

    loc = kiln.tensor([0.3, -1.0], dtype=kiln.float64, requires_grad=True)
    scale = kiln.tensor([1.5, 0.5], dtype=kiln.float64, requires_grad=True)
    assert kiln.autograd.gradcheck(draw(D.Normal), (loc, scale))
    low = kiln.tensor([0.3, -1.0], dtype=kiln.float64, requires_grad=True)
    high = kiln.tensor([1.5, 0.5], dtype=kiln.float64, requires_grad=True)
    assert kiln.autograd.gradcheck(draw(D.Uniform), (low, high))
    assert not D.Normal(loc, scale).sample().requires_grad
    # the reparametrized mean of a loss: d/dloc E[(x - 2)^2] = 2 (loc - 2)
    kiln.manual_seed(0)
    loc = kiln.tensor(0.5, requires_grad=True)
    ((D.Normal(loc, 1.0).rsample((100_000,)) - 2) ** 2).mean().backward()
    assert abs(loc.grad.item() - 2 * (0.5 - 2)) < 0.05


def test_log_prob_and_entropy_gradients_match_finite_differences():
    logits = kiln.tensor([[0.2, -1.0, 0.5]], dtype=kiln.float64, requires_grad=True)
    assert kiln.autograd.gradcheck(lambda t: D.Categorical(logits=t).log_prob(kiln.tensor([2, 0])), (logits,))
    assert kiln.autograd.gradcheck(lambda t: D.Categorical(logits=t).entropy(), (logits,))
    p = kiln.tensor([0.2, 0.7], dtype=kiln.float64, requires_grad=True)
    assert kiln.autograd.gradcheck(
        lambda t: D.Bernoulli(probs=t).log_prob(kiln.tensor([1.0, 0.0], dtype=kiln.float64)), (p,)
    )
    lo = kiln.tensor([-1.0, 0.5], dtype=kiln.float64, requires_grad=True)
    value = kiln.tensor([0.0, 1.0], dtype=kiln.float64)
    assert kiln.autograd.gradcheck(
        lambda t: D.Uniform(t, t + t * t + 2).log_prob(value) + D.Uniform(t, 3.0).entropy(), (lo,)
    )
    q_logits = kiln.tensor([[1.0, 0.0, -0.5]], dtype=kiln.float64)
    assert kiln.autograd.gradcheck(
        lambda t: D.kl_divergence(D.Categorical(logits=t), D.Categorical(logits=q_logits)), (logits,)
    )
    s = kiln.tensor([0.5, 2.0], dtype=kiln.float64, requires_grad=True)
    assert kiln.autograd.gradcheck(lambda t: D.kl_divergence(D.Normal(t, t * t), D.Normal(0.3, 1.5)), (s,))
    assert kiln.autograd.gradcheck(
        lambda t: D.Normal(t, t * t).log_prob(kiln.tensor([0.1, 0.2], dtype=kiln.float64)), (s,)
    )


def test_validation_errors_match_torch_messages():
    with pytest.raises(ValueError, match=r"scale .* GreaterThan\(lower_bound=0.0\)"):
        D.Normal(0.0, -1.0)
    with pytest.raises(ValueError, match="within the support"):
        D.Bernoulli(probs=kiln.tensor(0.3)).log_prob(kiln.tensor(0.5))
    with pytest.raises(ValueError, match="within the support"):
        D.Categorical(logits=kiln.zeros(3)).log_prob(kiln.tensor(3))
    with pytest.raises(ValueError, match="not both"):
        D.Categorical(probs=kiln.ones(2), logits=kiln.ones(2))
    with pytest.raises(ValueError, match="broadcastable"):
        D.Normal(kiln.zeros(3), 1.0).log_prob(kiln.zeros(2))
    D.Normal(0.0, -1.0, validate_args=False)  # no check when asked for none
    D.Distribution.set_default_validate_args(False)
    try:
        D.Normal(0.0, -1.0)
    finally:
        D.Distribution.set_default_validate_args(True)


def test_categorical_log_prob_broadcasts_values_over_the_batch(torch):
    logits = rng.normal(size=(3, 5)).astype(np.float32)
    values = rng.integers(0, 5, size=(7, 1))
    got = D.Categorical(logits=kiln.from_numpy(logits)).log_prob(kiln.from_numpy(values))
    expected = torch.distributions.Categorical(logits=torch.from_numpy(logits)).log_prob(torch.from_numpy(values))
    assert_close(got, expected, **TOL)
    assert_close(D.Categorical(logits=kiln.from_numpy(logits)).enumerate_support(),
                 torch.distributions.Categorical(logits=torch.from_numpy(logits)).enumerate_support(), rtol=0, atol=0)  # fmt: skip


def test_independent_matches_torch(torch):
    loc, tloc = pair(torch, rng.normal(size=(4, 3)))
    scale, tscale = pair(torch, rng.uniform(0.5, 2, size=(4, 3)))
    x, tx = pair(torch, rng.normal(size=(2, 4, 3)))
    d = D.Independent(D.Normal(loc, scale), 1)
    td = torch.distributions.Independent(torch.distributions.Normal(tloc, tscale), 1)
    assert (tuple(d.batch_shape), tuple(d.event_shape)) == (tuple(td.batch_shape), tuple(td.event_shape))
    assert_close(d.log_prob(x), td.log_prob(tx), **TOL)
    assert_close(d.entropy(), td.entropy(), **TOL)
    assert d.rsample((5,)).shape == td.rsample((5,)).shape and d.has_rsample
    other, tother = (
        D.Independent(D.Normal(loc * 0, 1.0), 1),
        torch.distributions.Independent(torch.distributions.Normal(tloc * 0, 1.0), 1),
    )
    assert_close(D.kl_divergence(d, other), torch.distributions.kl_divergence(td, tother), **TOL)
    assert tuple(d.expand((2, 4)).batch_shape) == (2, 4)
    with pytest.raises(ValueError, match="reinterpreted_batch_ndims"):
        D.Independent(D.Normal(loc, scale), 3)


@pytest.mark.parametrize("how", ["covariance_matrix", "precision_matrix", "scale_tril"])
def test_multivariate_normal_matches_torch(torch, how):
    a = rng.normal(size=(2, 3, 3))
    cov = a @ a.swapaxes(-1, -2) + 3 * np.eye(3)
    matrix = {"covariance_matrix": cov, "precision_matrix": np.linalg.inv(cov), "scale_tril": np.linalg.cholesky(cov)}[
        how
    ]
    loc, tloc = pair(torch, rng.normal(size=3), np.float64)
    m, tm = pair(torch, matrix, np.float64)
    x, tx = pair(torch, rng.normal(size=(4, 2, 3)), np.float64)
    d = D.MultivariateNormal(loc, **{how: m})
    td = torch.distributions.MultivariateNormal(tloc, **{how: tm})
    assert (tuple(d.batch_shape), tuple(d.event_shape)) == (tuple(td.batch_shape), tuple(td.event_shape))
    for name in ("mean", "variance", "covariance_matrix", "precision_matrix", "scale_tril"):
        assert_close(getattr(d, name), getattr(td, name), rtol=1e-10, atol=1e-12)
    assert_close(d.log_prob(x), td.log_prob(tx), rtol=1e-10, atol=1e-12)
    assert_close(d.entropy(), td.entropy(), rtol=1e-10, atol=1e-12)
    q, tq = (
        D.MultivariateNormal(loc * 2, scale_tril=d.scale_tril[0]),
        torch.distributions.MultivariateNormal(tloc * 2, scale_tril=td.scale_tril[0]),
    )
    assert_close(D.kl_divergence(d, q), torch.distributions.kl_divergence(td, tq), rtol=1e-10, atol=1e-12)


def test_multivariate_normal_samples_and_gradients():
    kiln.manual_seed(1)
    cov = np.array([[2.0, 0.8], [0.8, 1.0]])
    d = D.MultivariateNormal(kiln.tensor([1.0, -1.0], dtype=kiln.float64), kiln.from_numpy(cov))
    x = d.sample((100_000,)).numpy()
    np.testing.assert_allclose(x.mean(0), [1.0, -1.0], atol=0.02)
    np.testing.assert_allclose(np.cov(x.T), cov, atol=0.03)
    loc = kiln.tensor([0.3, -0.2], dtype=kiln.float64, requires_grad=True)
    tril = kiln.tensor([[1.2, 0.0], [0.4, 0.7]], dtype=kiln.float64, requires_grad=True)
    value = kiln.tensor([[0.5, 0.1], [-1.0, 2.0]], dtype=kiln.float64)
    assert kiln.autograd.gradcheck(
        lambda m, s: D.MultivariateNormal(m, scale_tril=s.tril()).log_prob(value), (loc, tril)
    )

    def draw(m, s):
        kiln.manual_seed(5)
        return D.MultivariateNormal(m, scale_tril=s.tril()).rsample((3,))

    assert kiln.autograd.gradcheck(draw, (loc, tril))
    with pytest.raises(ValueError, match="positive-definite"):
        D.MultivariateNormal(kiln.zeros(2), -kiln.eye(2))
    with pytest.raises(ValueError, match="Exactly one"):
        D.MultivariateNormal(kiln.zeros(2), kiln.eye(2), scale_tril=kiln.eye(2))


def test_validation_is_a_check_node_of_compiled_programs():
    """Validating arguments and log_prob values does not stop a trace; compiled calls raise as eager."""

    def log_prob(p, a, loc, scale, x):
        return D.Categorical(probs=p).log_prob(a) + D.Normal(loc, scale).log_prob(x).sum()

    compiled = kiln.compile(log_prob)
    good = (kiln.softmax(kiln.randn(4, 3), -1), kiln.tensor([0, 1, 2, 0]), kiln.zeros(3), kiln.ones(3), kiln.randn(3))
    for _ in range(3):
        assert_close(compiled(*good), log_prob(*good), rtol=1e-6, atol=1e-6)
    assert "1 specialization(s), 0 trace break(s)" in kiln.explain(compiled, *good).summary()
    negative = good[0].clone()
    negative[0, 0] = -0.5
    for bad, what in (((negative,) + good[1:], "parameter probs"), ((good[0], kiln.tensor([0, 1, 5, 0])) + good[2:],
                      "value argument"), (good[:3] + (-good[3],) + good[4:], "parameter scale")):  # fmt: skip
        for fn in (log_prob, compiled):
            with pytest.raises(ValueError, match=what):
                fn(*bad)
