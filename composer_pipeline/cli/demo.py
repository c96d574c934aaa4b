"""``composer-pipeline demo``: the main job end to end through Dagster (see ``assets/demo.py``).

Sample sessions -> ingest -> cost plan (blocking budget check) -> replay against local teachers over
real HTTP -> DPO pairs -> normalized pairs -> training set -> a short training run -> evaluation,
recorded in ``.dagster_home`` so ``dagster dev -w workspace.yaml`` shows the runs. Dagster itself is
imported only inside ``run`` from the top-level ``assets`` package (never from this package's modules).
"""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="run the whole pipeline through Dagster on the sample sessions")
    p.add_argument("--trace-root", default=None, help="Claude Code projects dir (default: the bundled samples)")
    p.add_argument("--store", default=None, help="table store: dir or s3://bucket/prefix (default .store, or $COMPOSER_STORE)")
    p.add_argument("--steps", type=int, default=None, help="trainer steps (default: recipes/train.yaml optim.steps)")
    p.add_argument("--skip-train", action="store_true", help="stop after the training set (no training, no eval)")
    p.add_argument("--teachers", default=None, help="teachers recipe (default recipes/demo_teachers.yaml)")
    p.add_argument("--keep-teachers", action="store_true", help="leave a local teacher server it started running")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os
    import sys

    from composer_pipeline.bootstrap import ROOT

    if str(ROOT) not in sys.path:  # `assets`/`resources` live at the repo root
        sys.path.insert(0, str(ROOT))
    from assets.demo import print_report, run_demo

    report = run_demo(args.trace_root, args.store, args.steps, args.skip_train, args.teachers, args.keep_teachers)
    print_report(report)
    return 1 if report.failed else 0
