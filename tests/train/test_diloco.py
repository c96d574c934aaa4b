"""DiLoCo's outer step through torchft: two replica groups (threads, each with its own torchft Manager,
a real lighthouse and a gloo process group on loopback), checked against hand computations.

* sign and Nesterov: Δ_g = θ_before − θ_after, averaged over the groups, stepped by Nesterov SGD;
* H = 1, outer_lr 1, no momentum: the outer step is the mean of the groups' inner steps, i.e. the
  data-parallel step on the averaged gradient (what DDP computes and tests/scaling checks against one
  process), here on the tiny causal LM with its real loss.
"""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from composer_pipeline.train.config import DiLoCoSection
from composer_pipeline.train.diloco import wrap
from composer_pipeline.train.diloco_manager import lighthouse_server, make_manager
from composer_pipeline.train.distributed import shard


def _run_groups(d: DiLoCoSection, models, losses, inner_lr: float, steps: int):
    """Each group g: ``steps`` inner SGD steps on ``losses[g](model)`` under torchft's DiLoCo."""
    # every quorum holds all groups: under load the first group can ask before the second heartbeats,
    # and a quorum of one would be a correct DiLoCo step but not the one computed by hand here
    lighthouse = lighthouse_server(d, min_replicas=len(models))

    def group(g: int):
        manager = make_manager(g, lighthouse.address(), d, host="127.0.0.1")
        try:
            model = models[g]
            inner = torch.optim.SGD(model.parameters(), lr=inner_lr)
            with wrap(manager, model, inner, d):
                for _ in range(steps):
                    inner.zero_grad()
                    losses[g](model).backward()
                    inner.step()
            return manager.current_step(), manager.num_participants(), manager.allreduce_bytes
        finally:
            manager.shutdown(wait=False)

    try:
        with ThreadPoolExecutor(len(models)) as pool:
            return list(pool.map(group, range(len(models))))
    finally:
        lighthouse.shutdown()


def test_outer_step_sign_and_nesterov_by_hand():
    d = DiLoCoSection(replica_groups=2, inner_steps=1, outer_lr=0.5, outer_momentum=0.9, nesterov=True, timeout_s=20)
    models = []
    for _ in range(2):
        m = torch.nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            m.weight.copy_(torch.tensor([[1.0, -2.0]]))
        models.append(m)
    xs = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])]
    # loss_g = w·x_g: gradient x_g, so an inner SGD step (lr 0.1) moves w by −0.1·x_g
    losses = [lambda m, x=x: (m.weight[0] * x).sum() for x in xs]
    out = _run_groups(d, models, losses, inner_lr=0.1, steps=2)
    # two committed outer steps, both groups live
    assert [o[:2] for o in out] == [(2, 2), (2, 2)]

    # by hand: Δ_g = θ_before − θ_after = 0.1·x_g; Δ = mean = (0.05, 0.10)
    # outer step 1: b = Δ; update = Δ + 0.9·b = 1.9·Δ = (0.095, 0.19); θ = (1, −2) − 0.5·update
    # outer step 2: Δ the same (linear loss); b = 0.9·b + Δ = 1.9·Δ; update = Δ + 0.9·b = 2.71·Δ
    theta1 = (1.0 - 0.5 * 0.095, -2.0 - 0.5 * 0.19)
    assert theta1 == pytest.approx((0.9525, -2.095))
    theta2 = (theta1[0] - 0.5 * 0.1355, theta1[1] - 0.5 * 0.271)
    for m in models:
        assert m.weight[0].tolist() == pytest.approx(list(theta2), abs=1e-6)
    # the sign: the outer step moves the weights the way the inner steps did (downhill), not back
    assert theta2[0] < 1.0 and theta2[1] < -2.0
    # what went over the wire: each sync all-reduces one pseudo-gradient of the model's size
    assert out[0][2] == 2 * 2 * 4


def test_two_groups_h1_outer_lr1_equal_the_ddp_average_step(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).float()
    vocab = base.config.vocab_size
    batches = [torch.randint(0, vocab, (2, 12)) for _ in range(2)]  # one shard per group, equal sizes

    def lm_loss(model, ids):
        return model(input_ids=ids, labels=ids).loss

    # the data-parallel reference: one process, the mean of the two shards' losses (DDP averages the
    # two ranks' gradients, which is the gradient of this mean), two SGD steps
    ddp = copy.deepcopy(base)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    for _ in range(2):
        opt.zero_grad()
        ((lm_loss(ddp, batches[0]) + lm_loss(ddp, batches[1])) / 2).backward()
        opt.step()

    d = DiLoCoSection(replica_groups=2, inner_steps=1, outer_lr=1.0, outer_momentum=0.0, nesterov=False, timeout_s=20)
    models = [copy.deepcopy(base), copy.deepcopy(base)]
    losses = [lambda m, b=b: lm_loss(m, b) for b in batches]
    out = _run_groups(d, models, losses, inner_lr=0.5, steps=2)
    assert [o[0] for o in out] == [2, 2]

    moved = max(float((p - q).detach().abs().max()) for p, q in zip(ddp.parameters(), base.parameters()))
    for m in models:
        apart = max(float((p - q).detach().abs().max()) for p, q in zip(ddp.parameters(), m.parameters()))
        assert apart < 1e-5 and apart < moved / 100, (apart, moved)
    # DDP all-reduces every gradient every step; DiLoCo one pseudo-gradient per sync: with H = 1 the same
    n_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    assert out[0][2] == 2 * n_bytes


def test_shards_are_disjoint_and_cover():
    items = list(range(7))
    parts = [shard(items, g, 3) for g in range(3)]
    assert sorted(x for p in parts for x in p) == items and parts[0] == [0, 3, 6]


def test_section_refuses_what_cannot_run():
    with pytest.raises(ValueError, match="multiple of diloco.inner_steps"):
        DiLoCoSection(replica_groups=2, inner_steps=3).outer_steps(10)
    with pytest.raises(ValueError, match="nesterov needs"):
        DiLoCoSection(outer_momentum=0.0, nesterov=True)
    with pytest.raises(ValueError, match="diloco.group"):
        DiLoCoSection(replica_groups=2, group=2)
