"""``composer-pipeline sql "<query>"``: DuckDB over the stored Parquet tables (views named after the assets).

Read-only by construction (``Store.duckdb``): a query reads the stored tables and nothing else; one that
would write a file, read another, reach the network, load an extension or change a setting is refused
(exit 2). DuckDB's temp directory is a private folder made for the query and removed after it (never
``<cwd>/.tmp``, which queries could read and write). A query running longer than ``--timeout-s`` (default
120 s) is interrupted (exit 2, saying so). Cells are printed with control characters escaped (a session key can hold a terminal escape).

The short partition key the Dagster UI shows (``calc/a1f0c3d2``) is accepted wherever a query names a
session: the view ``sessions`` (``session_key``, ``partition_key``) maps one to the other, the macro
``session_of(key)`` turns either key into the session key the tables use (an unknown key is an error),
and ``partition_of(session_key)`` gives the short key back, e.g.
``select * from trace_states where session_key = session_of('calc/a1f0c3d2')``. The pair tables also
carry ``partition_key`` beside ``session_key``.
"""

from __future__ import annotations

import argparse

MAX_CELL = 80
DEFAULT_TIMEOUT_S = 120.0


def _timeout(text: str) -> float:
    """``--timeout-s``: a positive, finite number of seconds."""
    import math

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return v


def register(subparsers) -> None:
    p = subparsers.add_parser("sql", help="run a DuckDB query over the stored tables")
    p.add_argument(
        "query",
        help='e.g. "select drop_op, count(*) from dropped_pairs group by 1"; a session by the '
        "short key the UI shows: where session_key = session_of('calc/a1f0c3d2') (view sessions maps both keys)",
    )
    p.add_argument(
        "--store",
        default=None,
        help="dir or s3:// prefix (default $COMPOSER_STORE or .store: where the demo and Dagster write)",
    )
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one JSON array of row objects")
    fmt.add_argument("--csv", action="store_true", help="CSV with a header row")
    p.add_argument("--full", action="store_true", help="do not truncate long cells in the table view")
    p.add_argument(
        "--timeout-s",
        type=_timeout,
        default=DEFAULT_TIMEOUT_S,
        help=f"interrupt a query running longer than this (default {DEFAULT_TIMEOUT_S:g} s)",
    )
    p.set_defaults(func=run)


def _cell(v, full: bool) -> str:
    from composer_pipeline.cli.terminal import safe

    s = safe("NULL" if v is None else str(v), cells=True)
    return s if full or len(s) <= MAX_CELL else s[: MAX_CELL - 1] + "…"


def format_table(columns: list[str], rows: list[tuple], full: bool = False) -> str:
    cells = [[_cell(v, full) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    line = "+".join("-" * (w + 2) for w in widths)
    out = [" | ".join(c.ljust(w) for c, w in zip(columns, widths)), line]
    out += [" | ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


# a session named by either key -> its session key (an unknown key is an error, not an empty result)
_SESSION_MACROS = (
    """CREATE MACRO session_of(k) AS (CASE WHEN k IS NULL THEN NULL ELSE coalesce(
         (SELECT first(session_key) FROM sessions WHERE partition_key = k OR session_key = k),
         error('no session with partition key or session key ' || k)) END)""",
    "CREATE MACRO partition_of(s) AS (SELECT first(partition_key) FROM sessions WHERE session_key = s)",
)


def add_session_keys(con) -> None:
    """The ``sessions`` view and the ``session_of`` / ``partition_of`` macros (module docstring), over the
    session keys of every stored table; a pair table's stored ``partition_key`` wins (Dagster named it)."""
    import pyarrow as pa

    from composer_pipeline.ids import partition_keys

    cols = con.execute(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE column_name IN ('session_key', 'partition_key')"
    ).fetchall()
    by_table: dict[str, set[str]] = {}
    for table, column in cols:
        by_table.setdefault(table, set()).add(column)
    sessions: set[str] = set()
    stored: dict[str, str] = {}
    for table, columns in sorted(by_table.items()):
        if "session_key" not in columns:
            continue
        q = f'SELECT DISTINCT session_key{", partition_key" if "partition_key" in columns else ""} FROM "{table}"'
        for session, *partition in con.execute(q).fetchall():
            if session:
                sessions.add(session)
                if partition and partition[0]:
                    stored.setdefault(session, partition[0])
    keys = partition_keys(sessions, stored)
    order = sorted(keys)
    con.register(
        "sessions",
        pa.table(
            {
                "session_key": pa.array(order, pa.string()),
                "partition_key": pa.array([keys[s] for s in order], pa.string()),
            }
        ),
    )
    for macro in _SESSION_MACROS:
        con.execute(macro)


def _query_error(e: Exception, store) -> ValueError:
    names = ", ".join(store.table_names()) or "none"
    return ValueError(f"{e}\n(tables under {store.root}: {names})")


def run(args: argparse.Namespace) -> int:
    import tempfile

    from composer_pipeline.store import Store, default_store

    store = Store(args.store or default_store())
    with tempfile.TemporaryDirectory(prefix="composer-sql-") as temp_dir:  # private (0700), removed after
        con = store.duckdb(temp_directory=temp_dir)
        try:
            add_session_keys(con)
            columns, rows = _execute(con, args.query, args.timeout_s, store)
        finally:
            con.close()
    if columns is not None:
        _print(columns, rows, args)
    return 0


def _execute(con, query: str, timeout_s: float, store) -> tuple[list[str] | None, list[tuple]]:
    """The query's columns and rows; interrupted after ``timeout_s`` (a clear ValueError, exit 2)."""
    import threading

    import duckdb

    timer = threading.Timer(timeout_s, con.interrupt)
    timer.start()
    try:
        cur = con.execute(query)
        if cur.description is None:
            return None, []
        return [d[0] for d in cur.description], cur.fetchall()
    except duckdb.InterruptException:
        raise ValueError(
            f"query interrupted after {timeout_s:g} s (--timeout-s {timeout_s:g}; raise it for a longer query)"
        ) from None
    except (duckdb.PermissionException, duckdb.InvalidInputException) as e:
        if isinstance(e, duckdb.PermissionException) or "configuration has been locked" in str(e):
            raise ValueError(
                f"refused: {e}\n(`sql` reads the stored tables only: no other files, network, extensions or settings)"
            ) from None
        raise _query_error(e, store) from None
    except duckdb.Error as e:
        raise _query_error(e, store) from None
    finally:
        timer.cancel()


def _print(columns: list[str], rows: list[tuple], args: argparse.Namespace) -> None:
    import csv
    import sys

    import orjson

    if args.json:
        print(orjson.dumps([dict(zip(columns, r)) for r in rows], default=str).decode())
    elif args.csv:
        w = csv.writer(sys.stdout, lineterminator="\n")
        # a person reads it: no terminal escapes from the data
        if sys.stdout.isatty():
            from composer_pipeline.cli.terminal import safe

            columns = [safe(c) for c in columns]
            rows = [tuple(safe(v) if isinstance(v, str) else v for v in r) for r in rows]
        w.writerow(columns)
        w.writerows(rows)
    else:
        print(format_table(columns, rows, args.full))
