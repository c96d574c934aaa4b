"""``composer-pipeline``: every pipeline stage without Dagster (the assets call the same code).

Each subcommand lives in its own module here with ``register(subparsers)``; modules import
their heavy dependencies (torch, data-juicer, ...) inside ``run`` so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# (module, what it adds) in the order a user runs them
SUBCOMMAND_MODULES = [
    "ingest",  # ingest PATH... --out DIR
    "replay",  # replay --states DIR --teachers FILE --out DIR
    "teachers",  # teachers serve ...
    "pairs",  # pairs --replays DIR --states DIR --out DIR
    "train",  # train --data DIR --recipe FILE --out DIR
    "model",  # model init-tiny --out DIR
    "show",  # show ID... [--store] [--json] [--all]
    "lineage",  # lineage PAIR_ID [--store] [--json]
    "sql",  # sql "<query>" [--store]
    "demo",  # demo: the main job end to end through Dagster
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="composer-pipeline", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            mod = importlib.import_module(f"composer_pipeline.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"composer_pipeline.cli.{name}":
                continue  # stage not built in this checkout
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from composer_pipeline.teachers.ledger import LedgerError, ReplayInterrupted

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args = build_parser().parse_args(argv)
    try:
        rc = args.func(args)
    except BrokenPipeError:  # `composer-pipeline sql ... | head`
        return 0
    except (FileNotFoundError, ValueError, KeyError, LedgerError) as e:
        if os.environ.get("COMPOSER_DEBUG"):
            raise
        print(f"composer-pipeline {args.command}: error: {e}", file=sys.stderr)
        return 2
    except ReplayInterrupted as e:
        print(f"composer-pipeline {args.command}: {e}", file=sys.stderr)
        return 128 + e.signum
    except OSError as e:  # disk full, permission denied, ... : one line naming the path, not a traceback
        if os.environ.get("COMPOSER_DEBUG"):
            raise
        where = f" {e.filename}" if e.filename else ""
        print(f"composer-pipeline {args.command}: error:{where}: {e.strerror or e}", file=sys.stderr)
        return 1
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
