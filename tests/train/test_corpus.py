"""Training straight from ingested Claude Code sessions (a project of each corpus: ours; the real one when
named; no replay yet): GRPO + SDPO fire, DPO is off."""

from __future__ import annotations

import math

import pyarrow.parquet as pq

from composer_pipeline.train.config import TrainRecipe
from composer_pipeline.train.run import train


def test_train_on_ingested_sessions(corpus, tiny_model_dir, tmp_path, capsys):
    from composer_pipeline.cli import main

    assert main(["ingest", str(corpus.root / corpus.expect["pairs_subdir"]), "--out", str(tmp_path / "ing")]) == 0
    capsys.readouterr()
    states = pq.read_table(tmp_path / "ing" / "trace_states.parquet")
    n_err = sum(states.column("has_error").to_pylist())
    assert states.num_rows > 0 and n_err >= 1
    recipe = TrainRecipe.from_dict(
        {
            "model": str(tiny_model_dir),
            "grpo": {"max_completion_length": 8},
            "data": {"max_prompt_tokens": 128, "heldout_fraction": 0.0},
        }
    )
    res = train(str(tmp_path / "ing"), recipe, steps=1, out_dir=tmp_path / "o")
    data = res.metrics["data"]
    assert (
        data["prompts"] + len(data["skipped"]) == states.num_rows
        # every state trained on or quarantined with a reason
    )
    assert data["error_sites"] == n_err
    (rec,) = res.losses
    assert (
        math.isfinite(rec["grpo"]) and rec["sdpo"] is not None and rec["sdpo"] > 0
    )  # the error site leads the first batch
    assert rec["dpo"] is None and rec["off_reasons"] == {"dpo": "no DPO pairs in the training data"}
