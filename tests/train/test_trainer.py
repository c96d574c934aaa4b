"""The three-channel trainer on the tiny model: each channel alone, all three together, checkpoint.

Kept small (1-3 steps, 2 prompts x 4 generations, 12-token completions) for 2 shared CPU cores.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from composer_pipeline.train.config import TrainRecipe
from composer_pipeline.train.run import train

REPO = Path(__file__).resolve().parents[2]


def _recipe(tiny_model_dir, *, grpo=1.0, sdpo=0.5, dpo=0.5, **dpo_section) -> TrainRecipe:
    r = TrainRecipe.from_dict(
        {
            "model": str(tiny_model_dir),
            "weights": {"grpo": grpo, "sdpo": sdpo, "dpo": dpo},
            "grpo": {"max_completion_length": 12, "num_generations": 4, "prompts_per_step": 2},
            # each mechanism on its own: plain DPO over every token, no NLL (the shipped default, all three
            # together, is test_the_shipped_preference_default_...)
            "dpo": {"batch_size": 2, "variant": "dpo", "preference_tokens": "all", "sft_weight": 0.0, **dpo_section},
            "data": {"max_prompt_tokens": 128, "heldout_fraction": 0.2},
            "optim": {"learning_rate": 1e-3},
        }
    )
    return r


def _changed(base_dir, ckpt) -> float:
    a, b = load_file(base_dir / "model.safetensors"), load_file(ckpt / "model.safetensors")
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.mark.parametrize(
    "channel,weights",
    [
        ("grpo", dict(grpo=1.0, sdpo=0.0, dpo=0.0)),
        ("sdpo", dict(grpo=0.0, sdpo=1.0, dpo=0.0)),
        ("dpo", dict(grpo=0.0, sdpo=0.0, dpo=1.0)),
    ],
)
def test_each_channel_alone_changes_parameters_and_only_its_loss_fires(
    tiny_model_dir, synth_store, tmp_path, channel, weights
):
    res = train(synth_store, _recipe(tiny_model_dir, **weights), steps=1, out_dir=tmp_path)
    (rec,) = res.losses
    assert rec[channel] is not None and rec[channel] != 0.0 and math.isfinite(rec[channel])
    for other in {"grpo", "sdpo", "dpo"} - {channel}:
        assert rec[other] is None
        assert other in rec["off"] and rec["off_reasons"][other].startswith("weight 0")
    assert rec["off"] == sorted({"grpo", "sdpo", "dpo"} - {channel})
    assert _changed(tiny_model_dir, res.checkpoint) > 0


def test_three_channels_together_over_several_batches(tiny_model_dir, synth_store, tmp_path):
    lines = []
    res = train(synth_store, _recipe(tiny_model_dir), steps=3, out_dir=tmp_path, on_step=lines.append)
    assert lines == res.losses and [r["step"] for r in lines] == [1, 2, 3]
    for r in res.losses:
        assert r["off"] == [], r["off_reasons"]
        for ch in ("grpo", "sdpo", "dpo"):
            assert r[ch] is not None and math.isfinite(r[ch])
        assert r["total"] == pytest.approx(1.0 * r["grpo"] + 0.5 * r["sdpo"] + 0.5 * r["dpo"])
        assert r["error_sites"] >= 1
    # different GRPO prompts and different DPO pairs at each step
    assert len({tuple(r["states"]) for r in res.losses}) == 3
    assert [r["dpo_batches"] for r in res.losses] == [[0], [1], [2]]
    # first step: policy == frozen reference, so DPO sigmoid loss is ln 2
    assert res.losses[0]["dpo"] == pytest.approx(math.log(2), abs=1e-4)
    assert res.losses[-1]["dpo"] < res.losses[0]["dpo"]
    # checkpoint contents
    ck = res.checkpoint
    for name in ("model.safetensors", "tokenizer.json", "config.json", "train.yaml", "metrics.json", "losses.jsonl"):
        assert (ck / name).is_file(), name
    assert set(res.plots) == {"grpo", "sdpo", "dpo", "total"}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in res.plots.values())
    assert [json.loads(line) for line in (ck / "losses.jsonl").read_text().splitlines()] == res.losses
    assert TrainRecipe.load(ck / "train.yaml") == _recipe(tiny_model_dir)
    metrics = json.loads((ck / "metrics.json").read_text())
    assert metrics["ln2_check"]["ok"] and metrics["channels_off"] == {}
    # save/reload gives identical logits
    assert metrics["reload_max_abs_logit_diff"] == 0.0
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(ck).eval()
    b = AutoModelForCausalLM.from_pretrained(ck).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)


def test_simpo_runs_reference_free(tiny_model_dir, synth_store, tmp_path):
    res = train(
        synth_store, _recipe(tiny_model_dir, grpo=0.0, sdpo=0.0, dpo=1.0, variant="simpo"), steps=2, out_dir=tmp_path
    )
    assert all(r["dpo"] is not None and math.isfinite(r["dpo"]) for r in res.losses)
    # SimPO has no reference: no ln 2 sanity value
    assert res.metrics["ln2_check"] is None
    assert _changed(tiny_model_dir, res.checkpoint) > 0


def test_lora_dpo_uses_adapter_disabled_reference(tiny_model_dir, synth_store, tmp_path):
    r = _recipe(tiny_model_dir, grpo=1.0, sdpo=0.5, dpo=1.0)
    r.lora.enabled = True
    res = train(synth_store, r, steps=1, out_dir=tmp_path)
    assert res.losses[0]["dpo"] == pytest.approx(math.log(2), abs=1e-4)
    assert res.losses[0]["off"] == []
    assert _changed(tiny_model_dir, res.checkpoint) > 0  # merged adapters
    assert res.metrics["reload_max_abs_logit_diff"] == 0.0


def test_dpo_sft_term_is_added_logged_and_keeps_the_ln2_check(tiny_model_dir, synth_store, tmp_path):
    """``dpo.sft_weight``: the channel's loss is the preference loss + w · NLL of the chosen answers (the
    NLL logged as ``dpo_sft``); the ln 2 sanity check still reads the preference part."""
    from dataclasses import replace

    r = _recipe(tiny_model_dir, grpo=0.0, sdpo=0.0, dpo=1.0)
    r = replace(r, dpo=replace(r.dpo, sft_weight=0.5))
    res = train(synth_store, r, steps=2, out_dir=tmp_path)
    first = res.losses[0]
    assert first["dpo_sft"] > 0
    assert first["dpo"] == pytest.approx(math.log(2) + 0.5 * first["dpo_sft"], abs=1e-4)
    assert res.metrics["ln2_check"]["ok"]
    assert all("dpo_sft" in rec for rec in res.losses)
    plain = train(
        synth_store, _recipe(tiny_model_dir, grpo=0.0, sdpo=0.0, dpo=1.0), steps=1, out_dir=tmp_path / "plain"
    )
    assert "dpo_sft" not in plain.losses[0]  # off at sft_weight 0: plain DPO


def test_the_shipped_preference_default_is_dpop_on_the_decision_token_with_the_nll(
    tiny_model_dir, synth_store, tmp_path
):
    """recipes/train.yaml's DPO section (the pre-registered SmolLM2 table's preference arm): DPOP's penalty
    and the NLL on the chosen answers are both live and logged, and the first step's preference part is
    still ln 2 (the margin over the first differing token is 0 where policy == reference)."""
    base = TrainRecipe.load(REPO / "recipes" / "train.yaml")
    assert (base.dpo.variant, base.dpo.preference_tokens, base.dpo.sft_weight) == ("dpop", "first_differing", 1.0)
    # a run with no recipe file trains the same
    assert base.dpo == TrainRecipe().dpo
    r = _recipe(tiny_model_dir, grpo=0.0, sdpo=0.0, dpo=1.0)
    r = TrainRecipe.from_dict({**r.to_dict(), "dpo": {**base.to_dict()["dpo"], "batch_size": 2}})
    res = train(synth_store, r, steps=3, out_dir=tmp_path)
    first = res.losses[0]
    assert first["dpo_sft"] > 0 and first["dpo_dpop"] == 0.0
    assert first["dpo"] == pytest.approx(math.log(2) + first["dpo_sft"], abs=1e-4)
    assert res.metrics["ln2_check"]["ok"]
    assert all("dpo_dpop" in rec and "dpo_sft" in rec for rec in res.losses)
    assert res.losses[-1]["dpo_margin"] > res.losses[0]["dpo_margin"]


def test_dpop_variant_logs_its_penalty_and_keeps_the_ln2_check(tiny_model_dir, synth_store, tmp_path):
    """``dpo.variant: dpop``: every step logs the penalty ``dpo_dpop`` (0 at the first step, where policy ==
    reference, so that step's loss is still ln 2); plain DPO logs none."""
    r = _recipe(tiny_model_dir, grpo=0.0, sdpo=0.0, dpo=1.0, variant="dpop", dpop_lambda=50.0)
    res = train(synth_store, r, steps=3, out_dir=tmp_path)
    assert [rec["dpo_dpop"] >= 0.0 for rec in res.losses] == [True] * 3
    assert res.losses[0]["dpo_dpop"] == 0.0
    assert res.losses[0]["dpo"] == pytest.approx(math.log(2), abs=1e-4)
    assert res.metrics["ln2_check"]["ok"]
    plain = train(
        synth_store, _recipe(tiny_model_dir, grpo=0.0, sdpo=0.0, dpo=1.0), steps=1, out_dir=tmp_path / "plain"
    )
    assert "dpo_dpop" not in plain.losses[0]


def test_dpo_alone_samples_no_rollouts_and_learns_the_same(tiny_model_dir, synth_store, tmp_path, monkeypatch):
    """With GRPO and SDPO off no loss reads a rollout, so none is sampled (model.generate is never called,
    no reward is logged); the DPO losses and the weights are exactly those of a run that samples them."""
    from transformers import GenerationMixin

    from composer_pipeline.train.trainer import ThreeChannelTrainer

    calls = []
    real = GenerationMixin.generate
    monkeypatch.setattr(GenerationMixin, "generate", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    r = _recipe(tiny_model_dir, grpo=0.0, sdpo=0.0, dpo=1.0)
    skipped = train(synth_store, r, steps=2, out_dir=tmp_path / "skip")
    assert calls == []
    assert all("reward" not in rec and rec["dpo"] is not None for rec in skipped.losses)
    monkeypatch.setattr(ThreeChannelTrainer, "skip_unread_rollouts", False)
    sampled = train(synth_store, r, steps=2, out_dir=tmp_path / "sample")
    assert len(calls) >= 2  # the control did sample
    assert [x["dpo"] for x in skipped.losses] == [x["dpo"] for x in sampled.losses]
    a, b = load_file(skipped.checkpoint / "model.safetensors"), load_file(sampled.checkpoint / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("teacher", ["initial", "current"])
def test_hint_teacher_is_the_frozen_start_or_the_live_policy(tiny_model_dir, synth_store, tmp_path, teacher):
    """``sdpo.teacher: initial`` scores the hinted context with the starting weights however far the policy
    has moved; ``current`` with the policy itself."""
    from dataclasses import replace

    from composer_pipeline.train.losses import completion_logits
    from composer_pipeline.train.modeling import load_policy
    from composer_pipeline.train.run import build_trainer

    r = _recipe(tiny_model_dir, grpo=0.0, sdpo=1.0, dpo=0.0)
    r = replace(r, sdpo=replace(r.sdpo, teacher=teacher))
    built = build_trainer(synth_store, r, steps=1, out_dir=tmp_path)
    tr = built.trainer
    assert (tr.start_copy is not None) == (teacher == "initial")  # no copy is made when nothing needs one
    with torch.no_grad():
        for p in tr.model.parameters():
            # the policy has moved away from the start
            p.add_(0.05 * torch.randn_like(p))
    ids, mask = torch.tensor([[5, 6, 7, 8]]), torch.ones(1, 4, dtype=torch.long)
    c_ids, c_mask = torch.tensor([[9, 10, 11]]), torch.ones(1, 3, dtype=torch.long)
    got = tr._hint_teacher_logits(tr.model, ids, mask, c_ids, c_mask)
    _, start = load_policy(str(tiny_model_dir))
    with torch.no_grad():
        at_start = completion_logits(start.eval(), ids, mask, c_ids, c_mask)
        live = completion_logits(tr.model, ids, mask, c_ids, c_mask)
    want, other = (at_start, live) if teacher == "initial" else (live, at_start)
    assert torch.allclose(got, want, atol=1e-5) and not torch.allclose(got, other, atol=1e-3)


def test_absent_inputs_are_reported_off(tiny_model_dir, tmp_path):
    import pyarrow as pa

    from composer_pipeline import tables
    from composer_pipeline.store import Store
    from tests.support.synthetic_train import pair_rows

    rows = [dict(r, has_error=False, error_after=None, kind="positive") for r in pair_rows(8)]
    Store(str(tmp_path / "d")).write_table(
        "positives", tables.conform(pa.Table.from_pylist(rows), "agreement_positives")
    )
    res = train(str(tmp_path / "d"), _recipe(tiny_model_dir), steps=1, out_dir=tmp_path / "o")
    rec = res.losses[0]
    assert rec["grpo"] is not None and rec["sdpo"] is None and rec["dpo"] is None
    assert rec["off_reasons"] == {
        "sdpo": "no error sites in the training data",
        "dpo": "no DPO pairs in the training data",
    }


def test_bad_recipe_and_missing_data_are_clear_errors(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="unknown keys"):
        TrainRecipe.from_dict({"weights": {"gamma": 1.0}})
    with pytest.raises(ValueError, match="all channel weights are 0"):
        train(str(tmp_path), _recipe(tiny_model_dir, grpo=0, sdpo=0, dpo=0), steps=1, out_dir=tmp_path / "o")
    with pytest.raises(FileNotFoundError, match="no training data"):
        train(str(tmp_path), _recipe(tiny_model_dir), steps=1, out_dir=tmp_path / "o")


@pytest.mark.parametrize("divergence", ["taid", "eopd"])
def test_hint_channel_trains_with_taid_and_eopd(tiny_model_dir, synth_store, tmp_path, divergence):
    """``sdpo.divergence`` picks the hint channel's loss; it fires, moves the weights and is logged, and
    TAID's t (logged per step) starts at t_start and never goes down."""
    from dataclasses import replace

    r = _recipe(tiny_model_dir, grpo=0.0, sdpo=1.0, dpo=0.0)
    taid = replace(r.sdpo.taid, alpha=0.2)  # a visible adaptive step in 3 steps
    r = replace(r, sdpo=replace(r.sdpo, divergence=divergence, taid=taid))
    res = train(synth_store, r, steps=3, out_dir=tmp_path)
    fired = [x for x in res.losses if x["sdpo"] is not None]
    assert len(fired) >= 2 and all(x["sdpo"] > 0 and math.isfinite(x["sdpo"]) for x in fired)
    assert all(x["sdpo_divergence"] == divergence for x in res.losses)
    assert _changed(tiny_model_dir, res.checkpoint) > 0
    if divergence == "taid":
        ts = [x["taid_t"] for x in fired]
        assert ts[0] == 0.4 and ts == sorted(ts) and ts[-1] > ts[0]
    else:
        assert all("taid_t" not in x for x in res.losses)


def test_the_nll_term_reads_the_chosen_answers_not_the_rejected(tiny_model_dir, synth_store, tmp_path):
    """The NLL term carries every measured gain (bench/RESULTS.md): computed on the rejected side it would
    teach the agents' mistakes. Its first logged value is the chosen answers' NLL under the start weights."""
    from dataclasses import replace

    from composer_pipeline.train.data import dpo_batches_from, load_train_data
    from composer_pipeline.train.losses import chosen_nll, completion_token_logps
    from composer_pipeline.train.modeling import load_policy

    r = _recipe(tiny_model_dir, grpo=0.0, sdpo=0.0, dpo=1.0)
    r = replace(r, dpo=replace(r.dpo, sft_weight=1.0))
    res = train(synth_store, r, steps=1, out_dir=tmp_path)
    (rec,) = res.losses
    data = load_train_data(synth_store, heldout_fraction=r.data.heldout_fraction, hints=r.sdpo.hint)
    tok, model = load_policy(str(tiny_model_dir))
    (i,) = rec["dpo_batches"]
    b = dpo_batches_from(tok, data.pairs, r)[i]
    n = b["prompt_ids"].size(0) // 2
    with torch.no_grad():
        lp = completion_token_logps(model, b["prompt_ids"], b["prompt_mask"], b["completion_ids"], b["completion_mask"])
    chosen, rejected = (chosen_nll(lp[s], b["completion_mask"][s]).item() for s in (slice(0, n), slice(n, None)))
    # the two sides are told apart by this check
    assert abs(chosen - rejected) > 1e-3
    assert rec["dpo_sft"] == pytest.approx(chosen, abs=1e-4), (rec["dpo_sft"], chosen, rejected)


def test_preference_over_the_differing_tokens_starts_at_ln2_and_moves_the_margin(tiny_model_dir, synth_store, tmp_path):
    """``dpo.preference_tokens: differing``: the reference reads the same span (first loss exactly ln 2),
    and the margin over that span moves; off by default it sums every token, as before."""
    from dataclasses import replace

    r = _recipe(tiny_model_dir, grpo=0.0, sdpo=0.0, dpo=1.0)
    r = replace(r, dpo=replace(r.dpo, preference_tokens="differing"))
    res = train(synth_store, r, steps=3, out_dir=tmp_path)
    assert res.losses[0]["dpo"] == pytest.approx(math.log(2), abs=1e-4)
    assert res.losses[-1]["dpo_margin"] != res.losses[0]["dpo_margin"]
    with pytest.raises(ValueError, match="preference_tokens"):
        TrainRecipe.from_dict({"dpo": {"preference_tokens": "some"}}).validate()
