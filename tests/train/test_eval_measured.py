"""An evaluation on a handful of held-out rows says it measured nothing (issue 24): the policy_eval
``no_regression`` check states that verdict (not a failure, issue 31), the comparison gates the action
parse rate, and the demo prints one plain smoke-run line naming the
command that does measure learning."""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg
import pyarrow as pa

from composer_pipeline.train.evaluate import LEARNING_COMMAND, measured, smoke_line

REPO = Path(__file__).resolve().parents[2]


def test_measured_counts_the_rows_of_the_comparing_metrics():
    metrics = {
        "preference_accuracy": {"value": 1.0, "n": 1},
        "reward": {"value": 0.03, "n": 2},
        "hint_jsd": {"value": 0.1, "n": 500},
        # hint_jsd does not compare policies: not counted
    }
    assert measured(metrics, 30) == (False, 2)
    assert measured({"reward": {"value": 0.5, "n": 40}}, 30) == (True, 40)
    assert measured({"reward": {"value": None, "n": 0}}, 30) == (False, 0)
    line = smoke_line(1, 2, 30)
    assert line.startswith("eval: a smoke run: training saw 1 DPO pairs and the evaluation 2 held-out rows")
    assert "too few to measure learning" in line and LEARNING_COMMAND in line


def test_demo_report_says_its_training_is_a_smoke_run():
    from assets.demo import DemoReport, print_report

    lines: list[str] = []
    r = DemoReport(
        store="/tmp/x",
        train={"steps": 2, "seconds": 1.0, "model": "tiny", "data": {"pairs": 1}},
        eval_metrics={
            "reward": {"trained": 0.0361, "base": 0.0361, "n": 1},
            "preference_accuracy": {"trained": None, "base": None, "n": 0},
        },
    )
    print_report(r, echo=lines.append)
    (smoke,) = [x for x in lines if x.startswith("eval: a smoke run")]
    assert "training saw 1 DPO pairs and the evaluation 1 held-out rows" in smoke and LEARNING_COMMAND in smoke
    lines.clear()
    r.eval_metrics["reward"]["n"] = 64
    print_report(r, echo=lines.append)
    assert not [x for x in lines if "smoke run" in x]


def test_no_regression_on_a_few_rows_says_it_measured_nothing(tiny_model_dir, synth_store, tmp_path):
    from assets.train import policy_eval
    from resources.recipes import PipelineRecipes
    from resources.storage import StoreResource

    trained = pa.table(
        {"local_dir": [str(tiny_model_dir)], "base_model": [str(tiny_model_dir)], "checkpoint": [str(tiny_model_dir)]}
    )
    recipes = PipelineRecipes(trace_root=str(tmp_path), train=str(REPO / "recipes" / "train.yaml"))
    out = list(
        policy_eval(
            dg.build_asset_context(), trained_policy=trained, recipes=recipes, store=StoreResource(root=synth_store)
        )
    )
    (check,) = [o for o in out if isinstance(o, dg.AssetCheckResult)]
    # the same model twice: nothing regressed, and a dozen synthetic pairs measure nothing either: a stated
    # not-measured verdict, not a failed check (issue 31: the run said Success while its log said "failed")
    assert check.passed is True and check.description.startswith("measured nothing:")
    assert check.metadata["measured"].value is False and check.metadata["heldout_rows"].value < 30
    assert LEARNING_COMMAND in check.description
    (output,) = [o for o in out if isinstance(o, dg.Output)]
    line = output.metadata["verdict"].value
    # one line: what improved, what regressed, what could not be measured and why, rounded numbers
    assert line.startswith("measured nothing: ") and "improved: none" in line and "regressed: none" in line
    assert "not measured: hint_jsd (no held-out error sites)" in line
    assert "action_parse_rate" in line and "reward" in line
    assert not re.search(r"\d\.\d{4,}", line), line  # rounded: no 0.036123...
    assert "action_parse_rate" in output.value.column("metric").to_pylist()


def test_the_comparison_fails_on_a_parse_rate_drop_beyond_the_tolerance():
    """A model that answers as well but breaks its tool calls regresses: the verdict says so in its line."""
    from composer_pipeline.train.evaluate import compare, verdict_line

    base = {"reward": {"value": 0.50, "n": 40}, "action_parse_rate": {"value": 1.0, "n": 40}}
    new = {"reward": {"value": 0.52, "n": 40}, "action_parse_rate": {"value": 0.70, "n": 40}}
    v = compare(base, new, tolerance=0.05)
    assert v["passed"] is False and v["action_parse_rate"]["regressed"] and not v["reward"]["regressed"]
    line = verdict_line(v, measured_rows=40, min_rows=30)
    assert "regressed: action_parse_rate 1.000 -> 0.700" in line and "improved: reward 0.500 -> 0.520" in line
    assert "hint_jsd (no held-out rows)" in line
    # within the tolerance it passes
    new["action_parse_rate"]["value"] = 0.97
    assert compare(base, new, tolerance=0.05)["passed"] is True
