"""``composer-pipeline export``: pairs as a Hugging Face dataset TRL reads as it is (DPO and SFT rows)."""

from __future__ import annotations

import json
import subprocess
import sys

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from composer_pipeline import tables
from composer_pipeline.train.config import TrainRecipe
from composer_pipeline.train.data import is_heldout
from tests.support.synthetic_pairs import synthetic_pairs


@pytest.fixture(scope="module")
def pair_store(tmp_path_factory):
    """A store whose normalized pairs have tool calls and tool results in their prompts, two sources."""
    root = tmp_path_factory.mktemp("store")
    t = synthetic_pairs(40, seed=3)
    rows = t.to_pylist()
    for i, r in enumerate(rows):
        r["source"] = "codex" if i % 4 == 0 else "claude"
        r["kind"] = "positive" if i % 10 == 9 else "pair"
    kept = [r for r in rows if r["kind"] == "pair"]
    positives = [r for r in rows if r["kind"] == "positive"]
    pq.write_table(
        pa.Table.from_pylist(kept, schema=tables.NORMALIZED_DPO_PAIRS), root / "normalized_dpo_pairs.parquet"
    )
    pq.write_table(pa.Table.from_pylist(positives, schema=tables.DPO_PAIRS), root / "agreement_positives.parquet")
    return root, kept, positives


def _export(store, fmt, out):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "composer_pipeline",
            "export",
            "--store",
            str(store),
            "--format",
            fmt,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_trl_export_loads_with_datasets_and_splits_as_the_trainer(pair_store, tmp_path):
    from datasets import load_dataset

    store, kept, _ = pair_store
    summary = _export(store, "trl", tmp_path / "ds")
    ds = load_dataset(
        "parquet",
        data_files={s: str(tmp_path / "ds" / "data" / f"{s}-00000-of-00001.parquet") for s in ("train", "test")},
    )
    assert ds["train"].num_rows + ds["test"].num_rows == len(kept) == sum(summary["rows"].values())
    fraction = TrainRecipe().data.heldout_fraction
    assert ds["test"].num_rows > 0
    for split in ("train", "test"):
        for row in ds[split]:
            assert is_heldout(row["state_id"], fraction) == (split == "test")
    row = ds["train"][0]
    by_id = {r["pair_id"]: r for r in kept}
    src = by_id[row["pair_id"]]
    assert [m["role"] for m in row["prompt"]] == [m["role"] for m in orjson.loads(src["prompt"])]
    assert len(row["chosen"]) == 1 and row["chosen"][0]["role"] == "assistant"
    assert len(row["rejected"]) == 1 and row["rejected"][0]["role"] == "assistant"
    calls = [c for r in ds["train"] for m in r["prompt"] for c in m["tool_calls"] or []]
    assert calls and all(isinstance(json.loads(c["function"]["arguments"]), dict) for c in calls)
    assert {r["source"] for r in ds["train"]} | {r["source"] for r in ds["test"]} == {"claude", "codex"}
    card = (tmp_path / "ds" / "README.md").read_text()
    for needle in ("| train |", "cross_model", "| codex |", "`replay_call_ids`", "`prompt`", "sha256(`state_id`)"):
        assert needle in card, needle
    # the card's YAML header names the splits: the folder loads by itself too
    assert load_dataset(str(tmp_path / "ds"))["test"].num_rows == ds["test"].num_rows


def test_sft_export_has_the_chosen_side_of_pairs_and_positives(pair_store, tmp_path):
    store, kept, positives = pair_store
    summary = _export(store, "sft", tmp_path / "sft")
    assert sum(summary["rows"].values()) == len(kept) + len(positives)
    rows = [
        r
        for s in ("train", "test")
        for r in pq.read_table(tmp_path / "sft" / "data" / f"{s}-00000-of-00001.parquet").to_pylist()
    ]
    by_id = {r["pair_id"]: r for r in kept + positives}
    for r in rows:
        src = by_id[r["pair_id"]]
        assert len(r["messages"]) == len(orjson.loads(src["prompt"])) + 1
        assert r["messages"][-1]["role"] == "assistant" and r["kind"] == src["kind"]


@pytest.mark.slow
def test_trl_dpo_trainer_trains_one_step_on_the_export(pair_store, tmp_path, tiny_model_dir):
    """TRL's own DPOTrainer, on the exported folder as it is, with the project's tiny model."""
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    store, _, _ = pair_store
    _export(store, "trl", tmp_path / "ds")
    train = load_dataset("parquet", data_files=str(tmp_path / "ds" / "data" / "train-*.parquet"))["train"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    config = DPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=1,
        per_device_train_batch_size=2,
        max_length=256,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        learning_rate=1e-3,
    )
    trainer = DPOTrainer(model=model, args=config, train_dataset=train, processing_class=tokenizer)
    out = trainer.train()
    assert out.global_step == 1 and out.training_loss == out.training_loss  # a number, not NaN
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())


def test_a_table_stored_before_the_source_column_reads_as_claude_codes(pair_store, tmp_path):
    """Stores written before Codex support have no ``source``: conform fills it, export names it."""
    store, kept, _ = pair_store
    old = pa.Table.from_pylist(kept, schema=tables.NORMALIZED_DPO_PAIRS).drop_columns(["source"])
    assert set(tables.conform(old, "dpo_pairs").column("source").to_pylist()) == {"claude"}
    (tmp_path / "old").mkdir()
    pq.write_table(old, tmp_path / "old" / "normalized_dpo_pairs.parquet")
    assert _export(tmp_path / "old", "trl", tmp_path / "ds")["sources"] == {"claude": len(kept)}
