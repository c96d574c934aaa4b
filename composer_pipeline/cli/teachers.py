"""``composer-pipeline teachers``: the local OpenAI-compatible teacher server and budget status.

``teachers serve [--model NAME_OR_PATH | --model NAME=PATH ...] [--config FILE] [--host H] [--port N]``
serves small local causal LMs (see ``composer_pipeline.teachers.server``); with ``--config`` the
``serve`` section of a teachers YAML names the models. ``teachers budget --teachers FILE [--ledger URL] [--json]``
prints one JSON line per teacher (``teacher, budget_usd, spent_usd, settled_usd, kept_usd, reserved_usd,
remaining_usd, kept_calls``; ``batch_held_usd, live_batches, batch_pending_calls``: the part of ``reserved_usd`` that
live provider batches hold (``mode: batch``), and from the ledger's ``billed_usage``: ``settled_calls, billed_usd, full_price_usd,
prompt_tokens, cached_prompt_tokens, cache_write_tokens``); ``teachers reconcile`` first finalizes every run whose lease expired.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any


def register(subparsers) -> None:
    p = subparsers.add_parser("teachers", help="local teacher server; teacher budgets")
    sub = p.add_subparsers(dest="teachers_command", required=True, metavar="ACTION")

    s = sub.add_parser("serve", help="serve local HF causal LMs over OpenAI-compatible HTTP (blocking)")
    s.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME_OR_PATH",
        help="model dir, known name (smollm2-135m-instruct, tiny) or NAME=PATH; repeatable",
    )
    s.add_argument("--config", default=None, help="teachers YAML whose `serve` section lists the models")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: loopback only)")
    s.add_argument("--port", type=int, default=8765, help="port (0 = any free port; the URL is printed)")
    s.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=1024,
        help="longer prompts lose their oldest messages first (CPU speed; default 1024)",
    )
    s.add_argument("--verbose", action="store_true", help="log every request to stderr")
    s.add_argument(
        "--idle-exit-s",
        type=float,
        default=None,
        help="exit after this many seconds without a completion request (default: serve until stopped)",
    )
    s.add_argument(
        "--exit-with-pid",
        type=int,
        default=None,
        help="exit when this process exits (the Dagster resource passes the code location's process)",
    )
    s.add_argument("--pid-file", default=None, help="write the server's pid here; removed when it exits")
    s.set_defaults(func=run_serve)

    k = sub.add_parser("stop", help="stop the local teacher servers Dagster runs started (pid files in the state dir)")
    k.add_argument(
        "--state-dir",
        default=None,
        help="where the servers' teacher_server-<port>.pid files are: beside the response cache "
        "(default $COMPOSER_PIPELINE_HOME, else ~/.cache/composer-pipeline)",
    )
    k.set_defaults(func=run_stop)

    ledger_help = (
        "ledger URL: a file path (SQLite) or postgresql://user@host/db (password via PGPASSWORD); "
        "default $COMPOSER_LEDGER_URL, else $COMPOSER_PIPELINE_HOME/ledger.sqlite"
    )
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


def _interrupt(signum, frame):
    raise KeyboardInterrupt


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
    import signal

    # `teachers stop`/kill: leave like Ctrl-C (pid file removed)
    signal.signal(signal.SIGTERM, _interrupt)
    pid_file = Path(args.pid_file) if args.pid_file else None
    if pid_file:
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        pid_file.write_text(str(os.getpid()))
    try:
        serve(
            models,
            args.host,
            args.port,
            max_prompt_tokens=args.max_prompt_tokens,
            on_ready=ready,
            log=log,
            idle_exit_s=args.idle_exit_s,
            exit_with_pid=args.exit_with_pid,
        )
    finally:
        if pid_file and pid_file.is_file() and pid_file.read_text().strip() == str(os.getpid()):
            pid_file.unlink()
    return 0


def stop_servers(state_dir: str | Path, timeout_s: float = 10.0) -> list[dict]:
    """SIGTERM each server named by a ``teacher_server-*.pid`` file under ``state_dir`` (only a process
    whose command line is a ``teachers serve``: a stale pid file never kills an unrelated process)."""
    import signal
    import time

    from composer_pipeline.teachers.server import process_alive

    out: list[dict[str, Any]] = []
    for pid_file in sorted(Path(state_dir).glob("teacher_server-*.pid")):
        try:
            pid = int(pid_file.read_text().strip())
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (ValueError, OSError):
            pid_file.unlink(missing_ok=True)
            out.append({"pid_file": str(pid_file), "status": "not running"})
            continue
        if "teachers serve" not in cmd:
            pid_file.unlink(missing_ok=True)
            out.append({"pid_file": str(pid_file), "pid": pid, "status": "pid reused by another process: left alone"})
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while process_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        alive = process_alive(pid)
        if not alive:
            pid_file.unlink(missing_ok=True)
        out.append({"pid_file": str(pid_file), "pid": pid, "status": "still running" if alive else "stopped"})
    return out


def run_stop(args: argparse.Namespace) -> int:
    import orjson

    from composer_pipeline.home import default_cache_dir

    state_dir = args.state_dir or Path(default_cache_dir()).parent
    results = stop_servers(state_dir)
    for r in results:
        print(orjson.dumps(r).decode())
    if not results:
        print(
            orjson.dumps(
                {"state_dir": str(Path(state_dir).resolve()), "status": "no teacher server pid files"}
            ).decode()
        )
    return 1 if any(r["status"] == "still running" for r in results) else 0


def _print_budgets(ledger, cfg) -> None:
    import orjson

    from composer_pipeline.ledger.batches import held_by_batches
    from composer_pipeline.ledger.billing import usage_by_teacher

    for t in cfg.teachers:
        # billed_usd / full_price_usd / cached_prompt_tokens: what providers billed, with prompt caching;
        # batch_held_usd: the part of reserved_usd live provider batches hold (up to 24 h, mode: batch)
        held, n_batches, n_calls = held_by_batches(ledger, t.name)
        batches = {"batch_held_usd": round(held, 8), "live_batches": n_batches, "batch_pending_calls": n_calls}
        print(
            orjson.dumps(
                {**ledger.balance(t.name, t.budget_usd).as_dict(), **batches, **usage_by_teacher(ledger, t.name)}
            ).decode(),
            flush=True,
        )


def run_budget(args: argparse.Namespace) -> int:
    from composer_pipeline.ledger import open_ledger
    from composer_pipeline.teachers.config import load_teachers

    cfg = load_teachers(args.teachers)
    _print_budgets(open_ledger(args.ledger), cfg)
    return 0


def run_reconcile(args: argparse.Namespace) -> int:
    import orjson

    from composer_pipeline.ledger import open_ledger
    from composer_pipeline.teachers.config import load_teachers

    cfg = load_teachers(args.teachers)
    ledger = open_ledger(args.ledger)
    done = ledger.reconcile()
    print(
        orjson.dumps(
            {"reconciled": done, "ledger": ledger.label, "open_reservations": ledger.open_reservations()}
        ).decode(),
        flush=True,
    )
    _print_budgets(ledger, cfg)
    return 0
