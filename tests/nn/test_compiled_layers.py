"""The newer layers under kiln.compile: whole training steps compiled vs eager on the same data, several calls."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
import kiln.optim as optim

RTOL, ATOL = 1e-4, 1e-5


class _ImageNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1, padding_mode="reflect")
        self.norm = nn.InstanceNorm2d(8, affine=True, track_running_stats=True)
        self.act = nn.Hardswish()
        self.shuffle = nn.PixelShuffle(2)
        self.up = nn.Upsample(scale_factor=0.5, mode="bilinear")
        self.pad = nn.ReplicationPad2d(1)
        self.drop = nn.Dropout2d(0.2)
        self.head = nn.Conv2d(2, 1, 3)

    def forward(self, x):
        x = self.drop(self.act(self.norm(self.conv(x))))
        return self.head(self.pad(self.up(self.shuffle(x))))


class _SequenceNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(4, 8, num_layers=2, bidirectional=True, batch_first=True)
        self.cell = nn.LSTMCell(16, 8)
        self.layer = nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, dropout=0.1, batch_first=True,
                                                norm_first=True)  # fmt: skip
        self.out = nn.Linear(8, 4)

    def forward(self, x):
        seq, _ = self.rnn(x)
        h, _ = self.cell(seq[:, -1])
        mask = nn.Transformer.generate_square_subsequent_mask(seq.shape[1])
        y = self.layer(seq[..., :8], h.unsqueeze(1), tgt_mask=mask)
        return self.out(F.gelu(y))


CASES = {
    "image-adadelta": (_ImageNet, lambda p: optim.Adadelta(p, lr=0.5), (4, 1, 6, 6),
                       lambda out, y: F.smooth_l1_loss(out, y, beta=0.5)),
    # Not an adaptive optimizer here: attention's key bias has a true gradient of 0, and Adam-like steps
    # would turn its rounding noise (which depends on the kernels' summation order) into updates.
    "sequence-asgd": (_SequenceNet, lambda p: optim.ASGD(p, lr=5e-2, t0=2), (3, 5, 4),
                       lambda out, y: F.huber_loss(out, y, delta=0.7)),
}  # fmt: skip


def _train(case: str, compiled: bool, steps: int = 6):
    build, make_opt, shape, loss_fn = CASES[case]
    kiln.manual_seed(0)
    model = build()
    opt = make_opt(model.parameters())

    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    f = kiln.compile(step) if compiled else step
    rng = np.random.default_rng(0)
    losses = []
    for i in range(steps):
        x = kiln.tensor(rng.standard_normal(shape).astype(np.float32))
        kiln.manual_seed(100 + i)
        with kiln.no_grad():
            y = model(x).detach() * 0 + kiln.tensor(rng.standard_normal(tuple(model(x).shape)).astype(np.float32))
        kiln.manual_seed(200 + i)
        losses.append(f(x, y).numpy().copy())
    return model, f, np.array(losses)


@pytest.mark.parametrize("case", list(CASES))
def test_training_step_compiled_equals_eager(case):
    m_c, f, loss_c = _train(case, True)
    m_e, _, loss_e = _train(case, False)
    np.testing.assert_allclose(loss_c, loss_e, rtol=RTOL, atol=ATOL)
    for (key, a), (_, b) in zip(m_c.state_dict().items(), m_e.state_dict().items(), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=RTOL, atol=ATOL, err_msg=key)
    assert sum(s.calls for s in f.state.specializations) >= 3  # the compiled program ran
