"""kiln.fft's real-valued functions against torch.fft, and the clear refusal of the complex ones."""

from __future__ import annotations

import pytest

import kiln
from tests.conftest import assert_close, to_torch
from tests.frontend.jit.helpers import check_against_eager


@pytest.mark.parametrize("n", [0, 1, 4, 5, 8])
@pytest.mark.parametrize("d", [1.0, 0.1])
def test_frequencies_match_torch(torch, n, d):
    assert_close(kiln.fft.fftfreq(n, d), torch.fft.fftfreq(n, d), rtol=1e-6, atol=0)
    assert_close(kiln.fft.rfftfreq(n, d), torch.fft.rfftfreq(n, d), rtol=1e-6, atol=0)
    assert_close(kiln.fft.fftfreq(n, d, dtype=kiln.float64), torch.fft.fftfreq(n, d, dtype=torch.float64), rtol=1e-15,
                 atol=0)  # fmt: skip
    assert kiln.fft.rfftfreq(n, requires_grad=True).requires_grad


@pytest.mark.parametrize("dim", [None, 0, 1, (0, 1), (-1,)])
def test_shifts_match_torch(torch, dim):
    x = kiln.arange(30).reshape(5, 6)
    t = to_torch(torch, x)
    assert_close(kiln.fft.fftshift(x, dim), torch.fft.fftshift(t, dim), rtol=0, atol=0)
    assert_close(kiln.fft.ifftshift(x, dim), torch.fft.ifftshift(t, dim), rtol=0, atol=0)
    assert_close(kiln.fft.ifftshift(kiln.fft.fftshift(x, dim), dim), x, rtol=0, atol=0)


def test_shift_gradient_and_compiled_shift():
    x = kiln.randn(4, 5, dtype=kiln.float64, requires_grad=True)
    assert kiln.autograd.gradcheck(lambda t: kiln.fft.fftshift(t) * kiln.arange(5, dtype=kiln.float64), (x,))
    check_against_eager(lambda t: kiln.fft.fftshift(t, 1) * 2.0, lambda: (kiln.randn(3, 7),), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["fft", "ifft", "rfft", "irfft", "fft2", "ifft2", "rfft2", "irfft2", "fftn", "ifftn",
                                  "rfftn", "irfftn", "hfft", "ihfft"])  # fmt: skip
def test_complex_transforms_refuse_with_the_reason(name):
    with pytest.raises(NotImplementedError, match="no complex dtype"):
        getattr(kiln.fft, name)(kiln.ones(4), n=4, dim=-1, norm="ortho")
