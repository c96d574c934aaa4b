"""``composer-pipeline teachers``: the local OpenAI-compatible teacher server and budget status.

``teachers serve [--model NAME_OR_PATH | --model NAME=PATH ...] [--config FILE] [--host H] [--port N]``
serves small local causal LMs (see ``composer_pipeline.teachers.server``); with ``--config`` the
``serve`` section of a teachers YAML names the models. ``teachers budget --teachers FILE [--ledger URL] [--json]``
prints one JSON line per teacher (``teacher, budget_usd, spent_usd, settled_usd, kept_usd, reserved_usd,
remaining_usd, kept_calls``); ``teachers reconcile`` first finalizes every run whose lease expired.
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("teachers", help="local teacher server; teacher budgets")
    sub = p.add_subparsers(dest="teachers_command", required=True, metavar="ACTION")

    s = sub.add_parser("serve", help="serve local HF causal LMs over OpenAI-compatible HTTP (blocking)")
    s.add_argument("--model", action="append", default=[], metavar="NAME_OR_PATH",
                   help="model dir, known name (smollm2-135m-instruct, tiny) or NAME=PATH; repeatable")
    s.add_argument("--config", default=None, help="teachers YAML whose `serve` section lists the models")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: loopback only)")
    s.add_argument("--port", type=int, default=8765, help="port (0 = any free port; the URL is printed)")
    s.add_argument("--max-prompt-tokens", type=int, default=1024,
                   help="longer prompts lose their oldest messages first (CPU speed; default 1024)")
    s.add_argument("--verbose", action="store_true", help="log every request to stderr")
    s.set_defaults(func=run_serve)

    ledger_help = ("ledger URL: a file path (SQLite) or postgresql://user@host/db (password via PGPASSWORD); "
                   "default $COMPOSER_LEDGER_URL, else $COMPOSER_PIPELINE_HOME/ledger.sqlite")
    b = sub.add_parser("budget", help="budget, spend, money in flight and remaining budget per teacher (JSON lines)")
    b.add_argument("--teachers", required=True, help="teachers YAML")
    b.add_argument("--ledger", default=None, help=ledger_help)
    b.add_argument("--json", action="store_true", help="JSON lines (the default output; accepted for scripts)")
    b.set_defaults(func=run_budget)

    r = sub.add_parser("reconcile", help="finalize runs whose lease expired now (released / kept), then print budgets")
    r.add_argument("--teachers", required=True, help="teachers YAML")
    r.add_argument("--ledger", default=None, help=ledger_help)
    r.set_defaults(func=run_reconcile)


def parse_models(specs: list[str]) -> dict[str, str]:
    models: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            path = spec
            name = spec.rstrip("/").rsplit("/", 1)[-1]
        if not name or not path:
            raise ValueError(f"--model {spec!r}: expected NAME_OR_PATH or NAME=PATH")
        if name in models:
            raise ValueError(f"--model: model name {name!r} given twice")
        models[name] = path
    return models


def run_serve(args: argparse.Namespace) -> int:
    from composer_pipeline.teachers.server import serve

    models = parse_models(args.model)
    if args.config:
        from composer_pipeline.teachers.config import load_teachers

        for name, path in load_teachers(args.config).serve.items():
            models.setdefault(name, path)
    if not models:
        raise ValueError("nothing to serve: pass --model NAME_OR_PATH or --config FILE with a `serve` section")
    print(f"loading {sorted(models)} ...", file=sys.stderr, flush=True)

    def ready(url: str) -> None:
        print(f"serving {sorted(models)} at {url} (POST {url}/chat/completions, GET {url}/models)", flush=True)

    log = (lambda line: print(line, file=sys.stderr, flush=True)) if args.verbose else None
    serve(models, args.host, args.port, max_prompt_tokens=args.max_prompt_tokens, on_ready=ready, log=log)
    return 0


def _print_budgets(ledger, cfg) -> None:
    import orjson

    for t in cfg.teachers:
        print(orjson.dumps(ledger.balance(t.name, t.budget_usd).as_dict()).decode(), flush=True)


def run_budget(args: argparse.Namespace) -> int:
    from composer_pipeline.teachers.config import load_teachers
    from composer_pipeline.teachers.ledger import open_ledger

    cfg = load_teachers(args.teachers)
    _print_budgets(open_ledger(args.ledger), cfg)
    return 0


def run_reconcile(args: argparse.Namespace) -> int:
    import orjson

    from composer_pipeline.teachers.config import load_teachers
    from composer_pipeline.teachers.ledger import open_ledger

    cfg = load_teachers(args.teachers)
    ledger = open_ledger(args.ledger)
    done = ledger.reconcile()
    print(orjson.dumps({"reconciled": done, "ledger": ledger.label, "open_reservations": ledger.open_reservations()}).decode(),
          flush=True)
    _print_budgets(ledger, cfg)
    return 0
