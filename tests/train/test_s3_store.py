"""`--data` as an s3:// Store root in the Dagster partitioned layout (a real moto S3 server on loopback)."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from composer_pipeline import tables
from composer_pipeline.store import Store
from composer_pipeline.train.config import TrainRecipe
from composer_pipeline.train.run import train
from tests.support.synthetic_train import pair_rows


@pytest.fixture()
def s3_root(moto_s3):
    return "s3://train-test/run1"


def test_train_reads_partitioned_tables_from_s3(s3_root, tiny_model_dir, tmp_path):
    store = Store(s3_root)
    rows = pair_rows(12)
    for part, chunk in (("sess_a", rows[:6]), ("sess_b", rows[6:])):
        for name, kind in (("normalized_dpo_pairs", "pair"), ("agreement_positives", "positive")):
            sel = [r for r in chunk if r["kind"] == kind]
            store.write_table(name, tables.conform(pa.Table.from_pylist(sel), name), partition=part)
    assert len(store.files("normalized_dpo_pairs")) == 2
    recipe = TrainRecipe.from_dict(
        {
            "model": str(tiny_model_dir),
            "grpo": {"max_completion_length": 8},
            "data": {"max_prompt_tokens": 128, "heldout_fraction": 0.0},
        }
    )
    res = train(s3_root, recipe, steps=1, out_dir=tmp_path)
    assert res.metrics["data"]["prompts"] == 12 and res.metrics["data"]["pairs"] == 8
    (rec,) = res.losses
    # the shipped default adds the NLL on the chosen answers (sft_weight 1) to the ln 2 preference part
    assert rec["off"] == [] and rec["dpo"] == pytest.approx(math.log(2) + rec["dpo_sft"], abs=1e-4)
    assert rec["sdpo"] > 0
