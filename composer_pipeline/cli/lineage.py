"""``composer-pipeline lineage PAIR_ID``: the chain behind one pair, down to the raw JSONL lines.

PAIR_ID may also name a session (its session key, or the short partition key the Dagster UI shows,
``calc/a1f0c3d2``): then the chain of every pair of that session, one after the other (``--json``: a
JSON array of chains; one pair id prints one chain object, as before)."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser("lineage", help="trace a pair back to teacher calls, state, session and raw lines")
    p.add_argument(
        "pair_id",
        help="pair id or a unique prefix (>= 6 chars), or a session: the short partition key "
        "the Dagster UI shows (calc/a1f0c3d2) or its session key (after --): every pair of it",
    )
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
    from composer_pipeline.lineage import format_lineage, resolve_pairs, to_json, trace_pair
    from composer_pipeline.store import default_store
    from composer_pipeline.stores import Stores

    stores = Stores.of(args.store or [default_store()])
    session, pair_ids = resolve_pairs(stores, args.pair_id)
    chains = [trace_pair(stores, pid) for pid in pair_ids]
    if args.json:
        print(to_json(chains) if session else to_json(chains[0]))
    else:  # (stored text: no terminal escapes)
        print("\n\n".join(safe(format_lineage(c)) for c in chains))
    return 0
