"""Join the cells of several run directories of the same experiment by seed (e.g. CPU cells made here and
GPU cells made on a lent machine: ``bench/gpu/``), then report them together.

In:  run directories (each a ``run.json`` and ``cells/``), listed in order of preference.
Out: under ``out``: ``cells/`` holding each seed's cells from one source only (every row gains ``device``),
     ``run.json`` (the shared settings plus ``devices``: seed -> device) and what :func:`.report.collect`
     writes from them.

A seed is never mixed: its arms are compared with its own start policy, and a start fitted on another
device (other arithmetic) is another start. A seed found in several sources is taken from the one with
the most of its cells (the first listed on a tie); the others' cells of that seed are left out and
counted. Sources whose settings differ in anything but the device are refused, naming the settings.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from composer_pipeline.experiments.read_before_edit.report import collect


def _settings(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "run.json"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} has no run.json: not a run directory of the experiment")
    return json.loads(path.read_text())


def _cells_by_seed(run_dir: Path) -> dict[int, list[Path]]:
    by: dict[int, list[Path]] = {}
    for p in sorted((run_dir / "cells").glob("seed*.json")):
        by.setdefault(json.loads(p.read_text())["row"]["seed"], []).append(p)
    return by


def merge_by_seed(sources: list[Path], out: Path) -> dict[str, Any]:
    """Copy each seed's cells from one of ``sources`` into ``out/cells`` and collect them; returns
    ``{"devices": {seed: device}, "from": {seed: source}, "left_out": [...], **collect(...)}``."""
    if not sources:
        raise ValueError("no run directories to merge")
    settings = [_settings(Path(s)) for s in sources]
    shared = {k: v for k, v in settings[0].items() if k != "device"}
    for src, s in zip(sources[1:], settings[1:]):
        other = {k: v for k, v in s.items() if k != "device"}
        diff = sorted(k for k in set(shared) | set(other) if shared.get(k) != other.get(k))
        if diff:
            raise ValueError(f"{sources[0]} and {src} ran other settings ({', '.join(diff)}): their cells do not mix")
    found = [_cells_by_seed(Path(s)) for s in sources]
    out = Path(out)
    if (out / "cells").exists():
        shutil.rmtree(out / "cells")
    (out / "cells").mkdir(parents=True)
    devices: dict[int, str] = {}
    taken_from: dict[int, str] = {}
    left_out: list[dict[str, Any]] = []
    for seed in sorted({seed for f in found for seed in f}):
        # the most cells of this seed wins; the first listed source on a tie (max keeps the first)
        best = max(range(len(sources)), key=lambda i: len(found[i].get(seed, [])))
        device = settings[best].get("device", "cpu")
        devices[seed], taken_from[seed] = device, str(sources[best])
        for path in found[best][seed]:
            cell = json.loads(path.read_text())
            cell["row"]["device"] = device
            (out / "cells" / path.name).write_text(json.dumps(cell))
        left_out += [
            {"seed": seed, "source": str(sources[i]), "cells": len(found[i][seed])}
            for i in range(len(sources))
            if i != best and seed in found[i]
        ]
    (out / "run.json").write_text(json.dumps({**shared, "devices": {str(k): v for k, v in devices.items()}}, indent=1))
    return {"devices": devices, "from": taken_from, "left_out": left_out, **collect(out)}
