"""``composer-pipeline``: every pipeline stage without Dagster (the assets call the same code).

Each subcommand lives in its own module here with ``register(subparsers)``; modules import
their heavy dependencies (torch, data-juicer, ...) inside ``run`` so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import threading
from typing import TYPE_CHECKING, NoReturn

from composer_pipeline.cli import (
    demo,
    experiment,
    export,
    ingest,
    lineage,
    model,
    pairs,
    replay,
    sessions,
    show,
    sql,
    teachers,
    train,
    workspace,
)

if TYPE_CHECKING:
    # (named for the checker only: importing the ledger costs a command that never uses it)
    from composer_pipeline.ledger.aio import ReplayInterrupted

# in the order a user runs them
SUBCOMMANDS = [
    # sessions push --to s3://bucket/prefix [--root DIR]
    sessions,
    ingest,  # ingest PATH... --out DIR
    # replay --states DIR --teachers FILE --out DIR
    replay,
    teachers,  # teachers serve ...
    # pairs --replays DIR --states DIR --out DIR
    pairs,
    # export --store DIR --format trl|sft --out DIR
    export,
    # train --data DIR --recipe FILE --out DIR
    train,
    model,  # model init-tiny --out DIR
    show,  # show ID... [--store] [--json] [--all]
    lineage,  # lineage PAIR_ID [--store] [--json]
    sql,  # sql "<query>" [--store]
    # demo: the main job end to end through Dagster
    demo,
    # experiment read-before-edit --out DIR: does the data make a better policy?
    experiment,
    # workspace verify --store DIR: would each file-tool action work in the workspace the agent saw?
    workspace,
]


def command_name(mod) -> str:
    """The subcommand a module of SUBCOMMANDS registers: its own name (``cli/ingest.py`` -> ``ingest``)."""
    return mod.__name__.rsplit(".", 1)[-1]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser with every subcommand, or only ``command`` where that names one: a run parses its
    own arguments the same way, with the same help and errors, without building the other subcommands'
    parsers (argparse looks up a translation for each of their strings: ~0.003 CPU-s of every run)."""
    parser = argparse.ArgumentParser(prog="composer-pipeline", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for mod in [m for m in SUBCOMMANDS if command_name(m) == command] or SUBCOMMANDS:
        mod.register(sub)
    return parser


# bad input a user can fix: one line on stderr and exit code 2 (COMPOSER_DEBUG=1 shows the traceback)
CLEAR_ERRORS = (FileNotFoundError, ValueError, KeyError)


def report_error(command: str, e: BaseException) -> int:
    if os.environ.get("COMPOSER_DEBUG"):
        raise e
    print(f"composer-pipeline {command}: error: {e}", file=sys.stderr)
    return 2


def _loaded(module: str, name: str) -> tuple[type[BaseException], ...]:
    """``module.name`` where this process has loaded ``module``, else nothing: a command that never
    imported the ledger cannot raise its errors, and importing it (asyncio, decimal: ~0.015 CPU-s) only to
    name them cost every ``ingest``."""
    cls = getattr(sys.modules.get(module), name, None)
    return (cls,) if cls is not None else ()


def _clear_errors() -> tuple[type[BaseException], ...]:
    """The errors a command reports in one line: :data:`CLEAR_ERRORS`, and the ledger's where it is loaded."""
    return (*CLEAR_ERRORS, *_loaded("composer_pipeline.ledger.backends", "LedgerError"))


def _interrupted() -> tuple[type[ReplayInterrupted], ...]:
    """``ReplayInterrupted`` where this process has loaded the ledger's asyncio façade (as :func:`_loaded`)."""
    cls = getattr(sys.modules.get("composer_pipeline.ledger.aio"), "ReplayInterrupted", None)
    return (cls,) if cls is not None else ()


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    try:
        rc = args.func(args)
    except BrokenPipeError:  # `composer-pipeline sql ... | head`
        return 0
    except _clear_errors() as e:
        return report_error(args.command, e)
    except _interrupted() as e:  # the ledger run was closed first
        print(f"composer-pipeline {args.command}: {e}", file=sys.stderr)
        return 128 + e.signum
    # disk full, permission denied, ... : one line naming the path, not a traceback
    except OSError as e:
        if os.environ.get("COMPOSER_DEBUG"):
            raise
        where = f" {e.filename}" if e.filename else ""
        print(f"composer-pipeline {args.command}: error:{where}: {e.strerror or e}", file=sys.stderr)
        return 1
    return int(rc or 0)


def run(argv: list[str] | None = None) -> NoReturn:
    """The ``composer-pipeline`` executable: :func:`main`, then Python's exit steps, then the process ends
    without C++ static destruction.

    Arrow's dataset scans can leave a worker thread alive into interpreter teardown, and a ``std::thread``
    destroyed while still joinable calls ``std::terminate``: the command had done its work and printed
    everything, yet exited -6 with "terminate called without an active exception" (seen once in ``show``
    and once in ``lineage`` under load; apache/arrow#39862, #34314). So the atexit handlers run here
    (temporary folders, logging, thread pools, Ray), the streams are flushed, and ``os._exit`` ends the
    process with the command's code. :func:`main` itself returns normally (tests call it in-process)."""
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's --help and usage errors
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    # as interpreter exit does: non-daemon threads finish first
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        # `... | head`, or a closed stream: nothing left to say
        except (BrokenPipeError, ValueError):
            pass
    os._exit(rc)


if __name__ == "__main__":
    run()
