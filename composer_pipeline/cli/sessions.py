"""``composer-pipeline sessions push --to s3://bucket/prefix [--root DIR ...]``: share sessions, scrubbed.

Scrubs every session file under the roots on this machine and uploads only the scrubbed copies;
a re-push uploads only what changed (``composer_pipeline/ingest/remote.py``). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json


def register(subparsers) -> None:
    p = subparsers.add_parser("sessions", help="sessions for a team: push scrubbed copies to an object store")
    sub = p.add_subparsers(dest="sessions_command", required=True, metavar="ACTION")
    q = sub.add_parser("push", help="upload scrubbed copies of the session files under the roots (changed ones only)")
    q.add_argument("--to", required=True, help="destination: s3://bucket/prefix (a trace root others ingest from)")
    q.add_argument(
        "--root",
        action="append",
        default=None,
        help="a local trace root; repeat for several (default ~/.claude/projects and ~/.codex/sessions, where they exist)",
    )
    q.add_argument("--recipe", default=None, help="ingest recipe whose extra_secret_patterns are scrubbed too")
    q.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from composer_pipeline.ingest.config import IngestRecipe
    from composer_pipeline.ingest.remote import DEFAULT_TRACE_ROOTS, push

    recipe = IngestRecipe.load(args.recipe)
    rep = push(args.root or list(DEFAULT_TRACE_ROOTS), args.to, recipe.extra_secret_patterns)
    print(json.dumps(rep.summary()))
    return 0
