"""``composer-pipeline demo``: the main job end to end through Dagster (see ``assets/demo.py``).

Sample sessions -> ingest -> cost plan (blocking budget check) -> replay against local teachers over
real HTTP -> DPO pairs -> normalized pairs -> training set -> a short training run -> evaluation,
recorded in ``.dagster_home`` so ``dagster dev -w workspace.yaml`` shows the runs. The Dagster layer
is the checkout's top-level ``assets`` folder (not installed: ``workspace.yaml`` loads it with
``working_directory: .``), so this runs ``python -m assets.demo`` with the checkout on its path.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace-root", default=None, help="Claude Code projects dir (default: the bundled samples)")
    p.add_argument(
        "--store", default=None, help="table store: dir or s3://bucket/prefix (default .store, or $COMPOSER_STORE)"
    )
    p.add_argument("--steps", type=int, default=None, help="trainer steps (default: recipes/train.yaml optim.steps)")
    p.add_argument("--skip-train", action="store_true", help="stop after the training set (no training, no eval)")
    p.add_argument("--teachers", default=None, help="teachers recipe (default recipes/demo_teachers.yaml)")
    p.add_argument("--keep-teachers", action="store_true", help="leave a local teacher server it started running")


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="run the whole pipeline through Dagster on the sample sessions")
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os
    import subprocess
    import sys

    from composer_pipeline.bootstrap import ROOT

    argv = [
        f"--{k.replace('_', '-')}={v}"
        for k in ("trace_root", "store", "teachers", "steps")
        if (v := getattr(args, k)) is not None
    ]
    argv += [f"--{k.replace('_', '-')}" for k in ("skip_train", "keep_teachers") if getattr(args, k)]
    # the checkout first, as workspace.yaml's working_directory does for `dagster dev`
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.call([sys.executable, "-m", "assets.demo", *argv], env=env)
