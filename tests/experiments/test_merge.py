"""Joining run directories by seed (``read_before_edit.merge``): GPU cells beside CPU ones, a seed never
mixed across devices, other settings refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from composer_pipeline.experiments.read_before_edit.merge import merge_by_seed
from composer_pipeline.experiments.read_before_edit.probe import score_outputs

SETTINGS = {"model": "local:smollm2-135m-instruct", "steps": 30, "version": 5}


def _outputs(hits: list[int]) -> list[dict]:
    states = ["request", "after_first_read"]
    return [
        {
            "state_id": f"s{i}",
            "state": states[i % 2],
            "kind": "unread" if i % 2 == 0 else "read",
            "want": "Read" if i % 2 == 0 else "Edit",
            "path": "/a.py",
            "answer": "Read /a.py",
            "tool_hit": h,
            "hit": h,
            "text": "<tool_call>…</tool_call>",
            "parsed": 1,
            "parse_error": None,
        }
        for i, h in enumerate(hits)
    ]


def _run_dir(root: Path, device: str | None, cells: dict[int, list[str]], **settings) -> Path:
    (root / "cells").mkdir(parents=True)
    fp = {**SETTINGS, **settings, **({"device": device} if device else {})}
    (root / "run.json").write_text(json.dumps(fp))
    for seed, arms in cells.items():
        for k, arm in enumerate(arms):
            outputs = _outputs([1, 1, (seed + k) % 2, 1])
            metrics = score_outputs(outputs)
            row = {"arm": arm, "seed": seed, **metrics, "steps": 0 if arm == "start" else 30, "seconds": 1.0}
            curve = [{"step": 0, **metrics}]
            (root / "cells" / f"seed{seed}-{arm}.json").write_text(
                json.dumps({"row": row, "curve": curve, "outputs": outputs})
            )
    return root


def test_each_seed_comes_whole_from_one_source(tmp_path):
    arms = ["start", "dpo", "nll"]  # in ARMS order, as collect writes them
    cpu = _run_dir(tmp_path / "cpu", None, {0: arms, 1: ["start"]})
    gpu = _run_dir(tmp_path / "gpu", "cuda", {1: arms, 2: arms})
    res = merge_by_seed([cpu, gpu], tmp_path / "merged")
    assert res["devices"] == {0: "cpu", 1: "cuda", 2: "cuda"}
    assert res["left_out"] == [{"seed": 1, "source": str(cpu), "cells": 1}]
    rows = [json.loads(line) for line in (tmp_path / "merged" / "results.jsonl").read_text().splitlines()]
    assert [(r["seed"], r["arm"], r["device"]) for r in rows] == [
        (s, a, d) for s, d in ((0, "cpu"), (1, "cuda"), (2, "cuda")) for a in arms
    ]
    run = json.loads((tmp_path / "merged" / "run.json").read_text())
    assert run == {**SETTINGS, "devices": {"0": "cpu", "1": "cuda", "2": "cuda"}}
    assert (tmp_path / "merged" / "table.md").read_text().strip()


def test_a_tie_keeps_the_first_source(tmp_path):
    cpu = _run_dir(tmp_path / "cpu", None, {0: ["start", "nll"]})
    gpu = _run_dir(tmp_path / "gpu", "cuda", {0: ["start", "dpo"]})
    assert merge_by_seed([cpu, gpu], tmp_path / "m1")["devices"] == {0: "cpu"}
    assert merge_by_seed([gpu, cpu], tmp_path / "m2")["devices"] == {0: "cuda"}


def test_other_settings_do_not_mix(tmp_path):
    cpu = _run_dir(tmp_path / "cpu", None, {0: ["start"]})
    gpu = _run_dir(tmp_path / "gpu", "cuda", {1: ["start"]}, steps=60)
    with pytest.raises(ValueError, match=r"other settings \(steps\)"):
        merge_by_seed([cpu, gpu], tmp_path / "merged")
    with pytest.raises(FileNotFoundError, match="no run.json"):
        merge_by_seed([cpu, tmp_path], tmp_path / "merged")
