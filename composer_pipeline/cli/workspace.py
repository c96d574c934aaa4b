"""``composer-pipeline workspace verify --store D [--json]``: for every trace state whose action is a file tool,
the workspace environment's prediction beside what really happened.

Each line: ``{state_id, tool, predicted_ok: true|false|null, observed_ok, reason}`` (null: the environment
cannot tell; ``observed_ok`` null: the call was interrupted). Without ``--json`` a table and the summary
(share with a verdict, agreement where there is one, observed failures predicted).
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("workspace", help="the workspace environment: verify file-tool actions of trace states")
    sub = p.add_subparsers(dest="workspace_command", required=True, metavar="{verify}")
    v = sub.add_parser("verify", help="predict each file-tool action's result and compare with the trace")
    v.add_argument(
        "--store",
        default=None,
        help="dir or s3:// prefix with trace_states + trace_messages (default $COMPOSER_STORE or .store)",
    )
    v.add_argument("--json", action="store_true", help="one JSON object per file-tool call, then none else")
    v.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import orjson

    from composer_pipeline.store import default_store
    from composer_pipeline.workspace.verify import summarize, verify_store

    verdicts = []
    for v in verify_store(args.store or default_store()):
        verdicts.append(v)
        if args.json:
            row = {k: getattr(v, k) for k in ("state_id", "tool", "predicted_ok", "observed_ok", "reason")}
            sys.stdout.write(orjson.dumps(row).decode() + "\n")
    if not args.json:
        from composer_pipeline.cli.terminal import safe

        show = {True: "ok", False: "fail", None: "?"}
        for v in verdicts:
            print(
                f"{v.state_id}  {v.tool:<9} predicted {show[v.predicted_ok]:<4} observed "
                f"{show[v.observed_ok]:<4} {safe(v.reason)}"
            )
        print(orjson.dumps(summarize(verdicts), option=orjson.OPT_INDENT_2).decode())
    return 0
