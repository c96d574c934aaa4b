"""``composer-pipeline show ID...``: what the agent saw at a step, what it did, what each teacher answered.

ID is a state id or a pair id (full, or a unique prefix of >= 6 chars); ``--all`` shows every stored
state. Without ``--json``: a terminal view (prefix messages with tool calls and shortened tool
results, the agent's action, the error that followed, each teacher's answer with status, cost and
latency, and for a pair chosen | rejected side by side). With ``--json``: one JSON object per line
(``state_id``, ``source_file``, ``source_lines``, ``prefix``, ``action``, ``error_after``, ``teachers``, and
for a pair ``pair_id``, ``chosen``, ``rejected`` and the agreement fields). The prefix is rendered by
the same function replay sends (``replay.requests.render_prompt``) with the recipe's render options.
"""

from __future__ import annotations

import argparse
import sys

# (a width of 10^8 printed 1.2 GB of rules)
MIN_WIDTH, MAX_WIDTH = 40, 1000


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "show", help="audit a state or pair: the exact prefix teachers saw, the action, each answer"
    )
    p.add_argument(
        "ids",
        nargs="*",
        metavar="ID",
        help="state id or pair id (or a unique prefix of >= 6 chars), or a "
        "session: the short partition key the Dagster UI shows (calc/a1f0c3d2) or its session key (after --)",
    )
    p.add_argument("--all", action="store_true", help="show every state in the store")
    p.add_argument(
        "--store",
        action="append",
        default=None,
        help="dir or s3:// prefix with the tables; repeat to search several (default $COMPOSER_STORE or .store)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line instead of the terminal view")
    p.add_argument(
        "--recipe",
        default=None,
        help="ingest recipe whose render: section gives the render options (default: render defaults, as replay)",
    )
    p.add_argument(
        "--compaction",
        choices=("after", "full"),
        default=None,
        help="override the recipe: after = what the agent had after a /compact, full = stitched history",
    )
    p.add_argument(
        "--teachers",
        default=None,
        help="teachers YAML: check each replay row's call_id against the request rebuilt from the shown prefix",
    )
    p.add_argument("--full", action="store_true", help="terminal view: shorten nothing")
    p.add_argument(
        "--width",
        type=int,
        default=None,
        help=f"terminal view width, {MIN_WIDTH}-{MAX_WIDTH} (default: the terminal's)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from composer_pipeline.cli.terminal import safe
    from composer_pipeline.render import RenderOptions
    from composer_pipeline.show import ShowError, format_view, gather, to_json_line
    from composer_pipeline.store import default_store

    if args.all and args.ids:
        raise ShowError("give IDs or --all, not both")
    if not args.all and not args.ids:
        raise ShowError("give at least one state or pair id (or --all)")
    if args.width is not None and not MIN_WIDTH <= args.width <= MAX_WIDTH:
        raise ShowError(f"--width must be between {MIN_WIDTH} and {MAX_WIDTH}, not {args.width}")
    opts = RenderOptions.from_recipe(args.recipe)
    if args.compaction:
        opts = dataclasses.replace(opts, compaction=args.compaction)
    teachers = None
    if args.teachers:
        from composer_pipeline.teachers.config import load_teachers

        teachers = load_teachers(args.teachers)
    roots = args.store or [default_store()]
    first = True
    for view in gather(roots, args.ids, all_states=args.all, opts=opts, teachers_config=teachers):
        if args.json:
            sys.stdout.write(to_json_line(view) + "\n")
        else:
            text = safe(format_view(view, width=args.width, full=args.full))  # (stored text: no terminal escapes)
            sys.stdout.write(("" if first else "\n\n") + text + "\n")
        first = False
    sys.stdout.flush()
    return 0
