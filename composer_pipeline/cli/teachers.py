"""``composer-pipeline teachers``: the local OpenAI-compatible teacher server and budget status.

``teachers serve [--model NAME_OR_PATH | --model NAME=PATH ...] [--config FILE] [--host H] [--port N]``
serves small local causal LMs (see ``composer_pipeline.teachers.server``); with ``--config`` the
``serve`` section of a teachers YAML names the models. ``teachers budget --teachers FILE [--ledger P]``
prints each teacher's budget, spend and remaining budget from the ledger as JSON lines.
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

    b = sub.add_parser("budget", help="budget, spend and remaining budget per teacher (JSON lines)")
    b.add_argument("--teachers", required=True, help="teachers YAML")
    b.add_argument("--ledger", default=None, help="ledger DuckDB (default $COMPOSER_PIPELINE_HOME/ledger.duckdb)")
    b.set_defaults(func=run_budget)


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


def run_budget(args: argparse.Namespace) -> int:
    import orjson

    from composer_pipeline.teachers.config import load_teachers
    from composer_pipeline.teachers.ledger import Ledger, default_home

    cfg = load_teachers(args.teachers)
    ledger = Ledger(args.ledger or default_home() / "ledger.duckdb")
    for t in cfg.teachers:
        spent = ledger.spent(t.name)
        print(orjson.dumps({"teacher": t.name, "budget_usd": t.budget_usd, "spent_usd": round(spent, 8),
                            "remaining_usd": round(max(0.0, t.budget_usd - spent), 8)}).decode())
    return 0
