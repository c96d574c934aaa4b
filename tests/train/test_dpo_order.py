"""The DPO channel's pair order (``dpo.data_order``): by default a seeded shuffle, reshuffled on every later
pass, so a run shorter than one pass over the pairs samples the whole table instead of reading only its
first rows (the pairs table is written session by session); ``table`` keeps the table's order. The
checkpoint's metrics say how many distinct pairs the run reached."""

from __future__ import annotations

import re
from dataclasses import replace
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from composer_pipeline.train.config import TrainRecipe
from composer_pipeline.train.data import dpo_batch_order, dpo_batches_from
from composer_pipeline.train.run import train


def _pairs(n: int) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(
            messages=[{"role": "user", "content": "next step?"}],
            tools=[],
            chosen_text=f"answer {i}",
            rejected_text=f"other {i}",
        )
        for i in range(n)
    ]


def _chosen_ids(tok, batch: dict) -> list[int]:
    """The pair numbers of a batch's chosen rows (its first half)."""
    rows = batch["completion_ids"][: batch["completion_ids"].size(0) // 2]
    return [int(re.search(r"answer (\d+)", tok.decode(r, skip_special_tokens=True)).group(1)) for r in rows]


def _steps(tok, batches, recipe: TrainRecipe, steps: int) -> list[list[int]]:
    """The pairs each of the first ``steps`` steps reads, in the trainer's batch order."""
    out: list[list[int]] = []
    epoch = 0
    while len(out) < steps:
        order = dpo_batch_order(len(batches), epoch, recipe.optim.seed, recipe.dpo.data_order)
        out += [_chosen_ids(tok, batches[i]) for i in order]
        epoch += 1
    return out[:steps]


def test_a_short_run_samples_the_whole_pairs_table_by_default(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    recipe = TrainRecipe.from_dict({"dpo": {"batch_size": 2}, "data": {"max_prompt_tokens": 32}})
    assert recipe.dpo.data_order == "shuffled"
    batches = dpo_batches_from(tok, _pairs(20), recipe)
    # nothing lost or doubled: every pair is in exactly one batch
    assert sorted(i for b in batches for i in _chosen_ids(tok, b)) == list(range(20))
    first_five = [i for step in _steps(tok, batches, recipe, 5) for i in step]
    # 5 steps x 2 pairs: half the table, drawn from both halves of it
    assert any(i >= 10 for i in first_five) and any(i < 10 for i in first_five)
    # the same seed gives the same order; another seed another one
    assert first_five == [i for s in _steps(tok, dpo_batches_from(tok, _pairs(20), recipe), recipe, 5) for i in s]
    other = replace(recipe, optim=replace(recipe.optim, seed=1))
    assert first_five != [i for s in _steps(tok, dpo_batches_from(tok, _pairs(20), other), other, 5) for i in s]

    table = replace(recipe, dpo=replace(recipe.dpo, data_order="table"))
    tb = dpo_batches_from(tok, _pairs(20), table)
    assert _steps(tok, tb, table, 12) == [[2 * k, 2 * k + 1] for k in range(10)] + [[0, 1], [2, 3]]


def test_every_pass_takes_each_batch_once_and_later_passes_reshuffle():
    for epoch in range(4):
        assert sorted(dpo_batch_order(7, epoch, 0, "shuffled")) == list(range(7))
        assert dpo_batch_order(7, epoch, 0, "table") == list(range(7))
    assert dpo_batch_order(7, 0, 0, "shuffled") == list(range(7))
    later = [dpo_batch_order(7, e, 0, "shuffled") for e in (1, 2, 3)]
    assert len({tuple(o) for o in later}) == 3 and all(o != list(range(7)) for o in later)
    assert dpo_batch_order(7, 2, 0, "shuffled") == later[1]


def test_a_recipe_refuses_an_unknown_pair_order():
    with pytest.raises(ValueError, match=r"dpo.data_order must be one of \['shuffled', 'table'\]"):
        TrainRecipe.from_dict({"dpo": {"data_order": "sorted"}})


def test_the_trainer_follows_the_order_and_reports_the_pairs_it_reached(tiny_model_dir, synth_store, tmp_path):
    r = TrainRecipe.from_dict(
        {
            "model": str(tiny_model_dir),
            "weights": {"grpo": 0.0, "sdpo": 0.0, "dpo": 1.0},
            "dpo": {"batch_size": 2, "max_completion_tokens": 16},
            "data": {"max_prompt_tokens": 64, "heldout_fraction": 0.0},
            "optim": {"seed": 5},
        }
    )
    short = train(synth_store, r, steps=2, out_dir=tmp_path / "short")
    n = short.metrics["data"]["pairs"]
    assert n >= 6 and short.metrics["data"]["pairs_reached"] == 4

    steps = n // 2 + 2
    res = train(synth_store, r, steps=steps, out_dir=tmp_path / "long")
    seen = [rec["dpo_batches"] for rec in res.losses]
    n_batches = -(-n // 2)
    want = dpo_batch_order(n_batches, 0, 5, "shuffled") + dpo_batch_order(n_batches, 1, 5, "shuffled")
    assert seen == [[b] for b in want[:steps]]
    assert res.metrics["data"]["pairs_reached"] == n
