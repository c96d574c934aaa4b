"""A training run must not break the tool-call format (issue 31): the preference term once raised the
margin while a third of the answers stopped parsing, and nothing said so.

The start is fitted to the teachers' consensus answers (:mod:`composer_pipeline.experiments.sft`), so its
greedy held-out answers are well-formed tool calls. A run from it on pairs in both directions must keep
the held-out ``action_parse_rate`` of :func:`composer_pipeline.train.evaluate.evaluate_policy`
(:func:`_assert_format_kept`); a run that does break the format (trained on answers cut mid-call) fails
that same assertion and the comparison's gate.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pytest

from composer_pipeline.store import Store
from composer_pipeline.train.config import TrainRecipe
from composer_pipeline.train.evaluate import compare, evaluate_policy
from composer_pipeline.train.run import train
from tests.support.synthetic_train import write_store

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 0.1


def _recipe(model, **dpo) -> TrainRecipe:
    """The shipped recipe's DPO channel with the learning experiment's NLL weight, at test sizes."""
    base = TrainRecipe.load(REPO / "recipes" / "train.yaml").to_dict()
    return TrainRecipe.from_dict(
        {
            **base,
            "model": str(model),
            "weights": {"grpo": 0.0, "sdpo": 0.0, "dpo": 1.0},
            "grpo": {**base["grpo"], "max_completion_length": 8, "num_generations": 2, "prompts_per_step": 1},
            "dpo": {**base["dpo"], "batch_size": 4, "sft_weight": 1.0, **dpo},
            "data": {**base["data"], "max_prompt_tokens": 128, "heldout_fraction": 0.3},
            "eval": {**base["eval"], "max_new_tokens": 56, "max_prompts": 8},
            "optim": {**base["optim"], "learning_rate": 3e-3, "seed": 0},
        }
    )


@pytest.fixture(scope="module")
def formatted_start(tiny_model_dir, tmp_path_factory):
    """Pairs in both directions and a start policy (fitted to the consensus answers) whose held-out answers parse."""
    from composer_pipeline.experiments.sft import supervise_on_agent_actions
    from composer_pipeline.train.data import load_train_data

    tmp = tmp_path_factory.mktemp("format-guard")
    root = write_store(tmp / "data", 36, both_directions=True)
    r = _recipe(tiny_model_dir)
    rows = load_train_data(root, heldout_fraction=r.data.heldout_fraction, hints=r.sdpo.hint).prompts
    rows = [dataclasses.replace(p, agent_action=p.consensus) for p in rows]
    start = supervise_on_agent_actions(
        str(tiny_model_dir), rows, tmp / "start", steps=60, seed=0, lr=3e-3, max_prompt_tokens=128
    )
    before = evaluate_policy(start, root, _recipe(start))
    assert before["action_parse_rate"]["n"] >= 5 and before["action_parse_rate"]["value"] == 1.0, before
    return root, start, before


def _assert_format_kept(before: dict, after: dict) -> None:
    b, a = before["action_parse_rate"], after["action_parse_rate"]
    assert a["value"] >= b["value"] - TOLERANCE, f"the run broke the tool-call format: parse rate {b} -> {a}"
    assert compare(before, after, tolerance=TOLERANCE)["action_parse_rate"]["regressed"] is False


def test_a_preference_run_keeps_the_tool_call_format(formatted_start, tmp_path):
    root, start, before = formatted_start
    res = train(root, _recipe(start), steps=8, out_dir=tmp_path / "run")
    assert res.losses[-1]["dpo_margin"] > res.losses[0]["dpo_margin"]  # it did train
    _assert_format_kept(before, evaluate_policy(res.checkpoint, root, _recipe(res.checkpoint)))


def test_a_format_breaking_run_fails_the_guard(formatted_start, tmp_path):
    """The guard's other half: trained on chosen answers cut mid-call, the same run breaks the format, and
    both the assertion above and the comparison's gate say so."""
    root, start, before = formatted_start
    store, cut = Store(root), Store(str(tmp_path / "cut"))
    pairs = store.read_table("pairs")
    texts = [t[: len(t) // 2] for t in pairs.column("chosen_text").to_pylist()]
    cut.write_table(
        "pairs", pairs.set_column(pairs.schema.get_field_index("chosen_text"), "chosen_text", pa.array(texts))
    )
    cut.write_table("positives", store.read_table("positives"))
    res = train(str(tmp_path / "cut"), _recipe(start, beta=0.0), steps=8, out_dir=tmp_path / "run")
    after = evaluate_policy(res.checkpoint, root, _recipe(res.checkpoint))
    with pytest.raises(AssertionError, match="broke the tool-call format"):
        _assert_format_kept(before, after)
    v = compare(before, after, tolerance=TOLERANCE)
    assert v["action_parse_rate"]["regressed"] and not v["passed"]
    assert after["action_parse_rate"]["errors"]  # counted by reason
