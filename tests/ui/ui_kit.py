"""Helpers the UI journeys import (a module of its own, not conftest.py, so the name is unique when
several test directories are given on one command line)."""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "composer_pipeline" / "samples" / "projects"
ARTIFACTS = REPO / "artifacts" / "ui"
LOCATION = "assets.definitions"


def shot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    p = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(p), full_page=False)
    return p


def hover_until_shown(page, target, shown, timeout_s: float = 60.0, per_try_ms: int = 4000) -> None:
    """Hover ``target()`` until ``shown()`` is visible. Both are callables returning a fresh locator on
    every try: a list that re-renders under the pointer (the sensor tick list gains a row every few
    seconds) detaches the hovered element and its tooltip closes, so one hover is not enough."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            target().hover(timeout=per_try_ms)
            shown().wait_for(timeout=per_try_ms)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            # move the pointer off so the next hover is a fresh enter event
            page.mouse.move(0, 0)
            page.wait_for_timeout(300)


def move_session(src_root: Path, dst_root: Path) -> str:
    """Move the first session under ``src_root`` (all its files, as discover groups them) to ``dst_root``."""
    from composer_pipeline.ingest.discover import discover_sessions

    sf = sorted(discover_sessions(src_root), key=lambda s: s.key)[0]
    for f in sorted(sf.files, key=lambda f: f.suffix == ".jsonl" and "agent-" not in f.name):  # main file last
        dst = dst_root / f.relative_to(src_root)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(f), dst)
    return sf.key


def teacher_server_pids(state_dir: Path) -> list[int]:
    """Running `composer-pipeline teachers serve` processes started for this instance (by pid file or
    by command line naming its teachers recipe)."""
    from composer_pipeline.teachers.server import process_alive as _running

    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "teachers serve" in cmd and str(state_dir.parent) in cmd and _running(int(proc.name)):
            pids.append(int(proc.name))
    return pids
