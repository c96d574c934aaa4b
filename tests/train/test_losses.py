"""Loss math: JSD parity with TRL, exact zero for identical contexts, DPO ln 2, SimPO formula."""

from __future__ import annotations

import math

import pytest
import torch

from composer_pipeline.train.losses import chosen_nll, completion_logits, dpo_sigmoid_loss, generalized_jsd, simpo_loss


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.9])
def test_jsd_matches_trl_generalized_jsd_loss(beta, temperature):
    from trl.experimental.gkd import GKDTrainer

    g = torch.Generator().manual_seed(int(beta * 10) + int(temperature * 100))
    s = torch.randn(3, 5, 17, generator=g)
    t = torch.randn(3, 5, 17, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    labels = torch.where(mask.bool(), torch.zeros_like(mask), torch.full_like(mask, -100))
    ours = generalized_jsd(s, t, mask, beta=beta, temperature=temperature)
    ref = GKDTrainer.generalized_jsd_loss(
        s, t, labels=labels, beta=beta, temperature=temperature, reduction="batchmean"
    )
    assert ours.item() > 0
    assert ours.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-7)


def test_jsd_gradient_matches_trl():
    from trl.experimental.gkd import GKDTrainer

    s1 = torch.randn(2, 4, 11, requires_grad=True)
    s2 = s1.detach().clone().requires_grad_(True)
    t = torch.randn(2, 4, 11)
    generalized_jsd(s1, t, torch.ones(2, 4), beta=0.5).backward()
    GKDTrainer.generalized_jsd_loss(s2, t, labels=torch.zeros(2, 4, dtype=torch.long), beta=0.5).backward()
    assert torch.allclose(s1.grad, s2.grad, atol=1e-6)


def test_jsd_is_exactly_zero_for_identical_contexts(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, 2000, (2, 9), generator=g)
    pmask = torch.ones_like(prompt)
    pmask[0, :3] = 0  # left padding
    comp = torch.randint(10, 2000, (2, 6), generator=g)
    cmask = torch.ones_like(comp)
    cmask[1, 4:] = 0
    student = completion_logits(model, prompt, pmask, comp, cmask)
    with torch.no_grad():
        teacher = completion_logits(model, prompt.clone(), pmask.clone(), comp, cmask)
    for beta in (0.0, 0.5, 1.0):
        jsd = generalized_jsd(student, teacher, cmask, beta=beta, temperature=0.9)
        assert jsd.item() == 0.0
    # and a different (hinted) context gives a positive divergence
    hinted = torch.cat([torch.randint(10, 2000, (2, 4), generator=g), prompt], dim=1)
    with torch.no_grad():
        teacher2 = completion_logits(
            model, hinted, torch.cat([torch.ones(2, 4, dtype=torch.long), pmask], 1), comp, cmask
        )
    assert generalized_jsd(student, teacher2, cmask).item() > 0


def test_jsd_rejects_bad_input():
    with pytest.raises(ValueError, match="differ"):
        generalized_jsd(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4))
    with pytest.raises(ValueError, match="beta"):
        generalized_jsd(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), beta=1.5)


def test_dpo_sigmoid_is_ln2_when_policy_equals_reference():
    pc, pr = torch.tensor([-12.0, -3.5]), torch.tensor([-20.0, -1.0])
    loss, margins = dpo_sigmoid_loss(pc, pr, pc.clone(), pr.clone(), beta=0.1)
    assert loss.item() == pytest.approx(math.log(2), abs=1e-7)
    assert torch.all(margins == 0)
    better, _ = dpo_sigmoid_loss(pc + 1.0, pr, pc, pr, beta=0.1)
    assert better.item() < math.log(2)


def test_chosen_nll_is_trls_sft_term():
    """TRL's DPO ``loss_type="sft"``: ``-chosen_per_token_logps[chosen_mask.bool()].mean()`` (trl 1.16,
    dpo_trainer.py): one mean over every chosen token of the batch, not a mean of per-row means."""
    g = torch.Generator().manual_seed(3)
    lp = -torch.rand(3, 6, generator=g) * 4
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
    trl_value = -lp[mask.bool()].mean()
    assert chosen_nll(lp * mask, mask).item() == pytest.approx(trl_value.item(), rel=1e-6)
    per_row_mean = -((lp * mask).sum(-1) / mask.sum(-1)).mean()
    assert abs(chosen_nll(lp * mask, mask).item() - per_row_mean.item()) > 1e-3  # the two differ here


def test_simpo_formula():
    c, r = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    loss, _ = simpo_loss(c, r, beta=2.0, gamma=0.5)
    expected = -torch.nn.functional.logsigmoid(2.0 * (c - r) - 0.5).mean()
    assert loss.item() == pytest.approx(expected.item())


def test_differing_token_masks_skip_the_shared_beginning_and_ending():
    """The preference term over the differing tokens: a shared beginning and a shared ending (the closing
    ``}\\n</tool_call>`` both answers need) are outside both spans; padding never is inside."""
    from composer_pipeline.train.losses import differing_token_masks

    pad = 0
    chosen = [5, 6, 7, 8, 9, 3, 4]  # 5 6 | 7 8 9 | 3 4
    rejected = [5, 6, 1, 3, 4]  # 5 6 | 1 | 3 4
    same = [5, 6, 3, 4]
    # the other is its beginning: nothing shared at the end
    prefix = [5, 6, 3, 4, 2]
    rows = [chosen, same, rejected, prefix]
    width = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    c, r = differing_token_masks(ids, mask, 2)
    assert c.tolist() == [[0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0]]
    assert r.tolist() == [[0, 0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 1, 0, 0]]
    c, r = differing_token_masks(ids, mask, 2, first_only=True)
    assert c.tolist() == [[0, 0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]]
    assert r.tolist() == [[0, 0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 1, 0, 0]]
