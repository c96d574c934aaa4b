"""The hint channel's other divergences: TAID (value, gradient, schedule) and entropy-aware OPD (its gate)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from composer_pipeline.train.losses import TaidSchedule, entropy_aware_kl, generalized_jsd, taid_loss

MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])


def _logits(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, 7, generator=g), torch.randn(2, 3, 7, generator=g)


@pytest.mark.parametrize("t", [0.0, 0.4, 1.0])
def test_taid_value_and_gradient_follow_the_rule(t):
    s, z_t = _logits(int(t * 10))
    s.requires_grad_(True)
    loss = taid_loss(s, z_t, t, MASK)
    loss.backward()
    # the rule: p_t = softmax((1-t)·z_s + t·z_T) with z_s a constant; loss = masked mean of -Σ p_t log softmax(z_s)
    p_t = torch.softmax((1 - t) * s.detach() + t * z_t, dim=-1)
    m = MASK.float()
    want = (-(p_t * torch.log_softmax(s.detach(), -1)).sum(-1) * m).sum() / m.sum()
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    # d/dz_s of a cross-entropy to a constant target: (softmax(z_s) - p_t) per masked token / token count
    want_grad = (torch.softmax(s.detach(), -1) - p_t) * (m / m.sum()).unsqueeze(-1)
    assert torch.allclose(s.grad, want_grad, atol=1e-6)
    if t == 0.0:
        # the target is the detached student itself
        assert s.grad.abs().max().item() < 1e-7
    # the target is the teacher alone: a plain cross-entropy to it
    if t == 1.0:
        assert loss.item() == pytest.approx(
            ((-(torch.softmax(z_t, -1) * torch.log_softmax(s.detach(), -1)).sum(-1) * m).sum() / m.sum()).item(),
            rel=1e-6,
        )


def test_taid_detach_changes_the_gradient():
    s, z_t = _logits(3)
    s1 = s.clone().requires_grad_(True)
    taid_loss(s1, z_t, 0.4, MASK).backward()
    # the same formula without the stop-gradient
    s2 = s.clone().requires_grad_(True)
    p_t = torch.softmax(0.6 * s2 + 0.4 * z_t, -1)
    m = MASK.float()
    ((-(p_t * torch.log_softmax(s2, -1)).sum(-1) * m).sum() / m.sum()).backward()
    assert not torch.allclose(s1.grad, s2.grad, atol=1e-4)


def test_taid_rejects_bad_input():
    with pytest.raises(ValueError, match="differ"):
        taid_loss(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4), 0.5, torch.ones(1, 2))
    with pytest.raises(ValueError, match="t must be"):
        taid_loss(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), 1.5, torch.ones(1, 2))


LOSSES = [2.0, 1.5, 1.2, 1.25, 0.9]


def test_taid_schedule_without_adaptation_is_the_linear_floor():
    sched = TaidSchedule(t_start=0.4, t_end=1.0, alpha=0.5, beta=0.9, total_steps=10, adaptive=False)
    seen = []
    for loss in LOSSES:
        seen.append(sched.t)
        sched.update(loss)
    seen.append(sched.t)
    # the first update only records the loss; then t = 0.4 + 0.6 · steps_done / 10
    assert seen == pytest.approx([0.4, 0.4, 0.52, 0.58, 0.64, 0.70])


def test_taid_schedule_with_adaptation_follows_the_momentum():
    sched = TaidSchedule(t_start=0.4, t_end=1.0, alpha=0.5, beta=0.9, total_steps=100, adaptive=True)
    sched.update(LOSSES[0])
    assert sched.t == 0.4 and sched.momentum == 0.0
    t, momentum, prev = 0.4, 0.0, LOSSES[0]
    for n, loss in enumerate(LOSSES[1:], start=2):
        sched.update(loss)
        momentum = 0.9 * momentum + 0.1 * (prev - loss) / (prev + 1e-15)
        step = 0.5 / (1 + math.exp(-momentum)) * (1 - t)
        t = min(1.0, max(0.4 + 0.6 * n / 100, t + step))
        prev = loss
        assert sched.t == pytest.approx(t, rel=1e-12)
    # here the adaptive step outruns the linear floor (which is only at 0.43)
    assert sched.t > 0.8
    # with the default α the floor dominates; t never passes t_end
    capped = TaidSchedule(t_start=0.4, t_end=0.8, alpha=1.0, beta=0.0, total_steps=2, adaptive=True)
    for loss in (3.0, 1.0, 0.5, 0.1):
        capped.update(loss)
    assert capped.t == 0.8


def test_taid_schedule_rejects_bad_settings():
    with pytest.raises(ValueError, match="t_start"):
        TaidSchedule(t_start=0.9, t_end=0.5, alpha=5e-4, beta=0.99, total_steps=3, adaptive=True)
    with pytest.raises(ValueError, match="total_steps"):
        TaidSchedule(t_start=0.4, t_end=1.0, alpha=5e-4, beta=0.99, total_steps=0, adaptive=True)


def _grad(fn, s):
    s = s.clone().requires_grad_(True)
    fn(s).backward()
    return s.grad


def test_eopd_below_the_gate_is_reverse_kl_and_above_it_reverse_plus_forward():
    s, z_t = _logits(7)
    below = _grad(lambda x: entropy_aware_kl(x, z_t, MASK, entropy_threshold=100.0), s)
    reverse = _grad(lambda x: generalized_jsd(x, z_t, MASK, beta=1.0), s)
    assert torch.allclose(below, reverse, atol=1e-6)
    above = _grad(lambda x: entropy_aware_kl(x, z_t, MASK, entropy_threshold=-1.0), s)
    both = _grad(lambda x: generalized_jsd(x, z_t, MASK, beta=1.0) + generalized_jsd(x, z_t, MASK, beta=0.0), s)
    assert torch.allclose(above, both, atol=1e-6)
    assert not torch.allclose(above, reverse, atol=1e-4)
    half = _grad(lambda x: entropy_aware_kl(x, z_t, MASK, entropy_threshold=-1.0, forward_weight=0.5), s)
    mixed = _grad(lambda x: generalized_jsd(x, z_t, MASK, beta=1.0) + 0.5 * generalized_jsd(x, z_t, MASK, beta=0.0), s)
    assert torch.allclose(half, mixed, atol=1e-6)


def test_eopd_gate_reads_the_teacher_entropy_not_the_student():
    """Token 0: a flat teacher (high entropy) and a peaked student; token 1 the other way round. Only token 0
    gets the forward KL."""
    peaked, flat = torch.tensor([8.0, 0, 0, 0, 0]), torch.zeros(5)
    teacher = torch.stack([flat, peaked]).unsqueeze(0)  # (1, 2, 5)
    student = torch.stack([peaked, flat]).unsqueeze(0)
    log_s, log_t = F.log_softmax(student, -1), F.log_softmax(teacher, -1)
    assert (-(log_t.exp() * log_t).sum(-1) > 1.0).tolist() == [[True, False]]
    assert (-(log_s.exp() * log_s).sum(-1) > 1.0).tolist() == [[False, True]]
    reverse = (log_s.exp() * (log_s - log_t)).sum(-1)[0]
    forward = (log_t.exp() * (log_t - log_s)).sum(-1)[0]
    got = entropy_aware_kl(student, teacher, torch.ones(1, 2), entropy_threshold=1.0)
    assert got.item() == pytest.approx(((reverse[0] + forward[0] + reverse[1]) / 2).item(), rel=1e-6)
    student_gated = ((reverse[0] + reverse[1] + forward[1]) / 2).item()
    assert got.item() != pytest.approx(student_gated, rel=1e-3)
