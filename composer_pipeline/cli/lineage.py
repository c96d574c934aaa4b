"""``composer-pipeline lineage PAIR_ID``: the chain behind one pair, down to the raw JSONL lines."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser("lineage", help="trace a pair back to teacher calls, state, session and raw lines")
    p.add_argument("pair_id", help="pair id or a unique prefix (>= 6 chars)")
    p.add_argument(
        "--store",
        action="append",
        default=None,
        help="dir or s3:// prefix with the tables; repeat to search several (default $COMPOSER_STORE or .store)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable chain")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from composer_pipeline.cli.terminal import safe
    from composer_pipeline.lineage import format_lineage, to_json, trace_pair
    from composer_pipeline.store import Store, default_store

    roots = args.store or [default_store()]
    chain = trace_pair([Store(r) for r in roots], args.pair_id)
    print(to_json(chain) if args.json else safe(format_lineage(chain)))  # (stored text: no terminal escapes)
    return 0
