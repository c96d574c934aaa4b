"""``composer-pipeline ingest PATH... --out DIR [--recipe FILE]``: sessions -> Parquet, no Dagster.

Writes ``trace_states.parquet``, ``trace_messages.parquet`` and ``quarantine.parquet`` under DIR
(local or ``s3://``), streaming session by session; prints one JSON line per input file and a
final totals line (with secrets scrubbed per kind).
"""

from __future__ import annotations

import argparse
import json
import sys

# low-cardinality columns only: dictionary-encoding raw lines and JSON content wastes time
DICTIONARY_COLUMNS = ("session_id", "session_key", "stream_id", "stream_kind", "agent_id", "parent_tool_use_id",
                      "source_file", "record_type", "subtype", "role", "model", "version", "reason")
# large JSON/text columns: min/max statistics of them help no reader and cost ~10 % of the write
NO_STATISTICS_COLUMNS = ("raw", "content", "tool_use_result", "action", "usage", "error_after", "text")
FLUSH_ROWS = 4000  # messages per Parquet row group (bounds memory; avoids tiny row groups)

def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("ingest", help="parse Claude Code session JSONL into trace states (Parquet)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="session file or directory (walked recursively)")
    p.add_argument("--out", required=True, help="output directory (local path or s3://bucket/prefix)")
    p.add_argument("--recipe", default=None, help="ingest recipe YAML (default: built-in defaults)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import gc
    from collections import Counter

    import pyarrow.parquet as pq

    from composer_pipeline import tables
    from composer_pipeline.ingest.pipeline import ingest_paths, to_table
    from composer_pipeline.ingest.recipe import IngestRecipe
    from composer_pipeline.store import Store

    recipe = IngestRecipe.load(args.recipe)
    store = Store(args.out)
    store.fs.makedirs(store.base, exist_ok=True)
    names = ("trace_states", "trace_messages", "quarantine")
    handles = {n: store.fs.open(store.path(f"{n}.parquet"), "wb") for n in names}
    writers = {
        n: pq.ParquetWriter(handles[n], tables.SCHEMAS[n], compression="zstd", compression_level=1,
                            use_dictionary=[c for c in DICTIONARY_COLUMNS if c in tables.SCHEMAS[n].names],
                            write_statistics=[c for c in tables.SCHEMAS[n].names if c not in NO_STATISTICS_COLUMNS])
        for n in names
    }
    pending: dict[str, dict[str, list]] = {n: {f.name: [] for f in tables.SCHEMAS[n]} for n in names}
    pending_rows = 0

    frozen = False

    def flush() -> None:  # many small sessions -> one Arrow conversion and row group per ~FLUSH_ROWS
        nonlocal pending_rows, frozen
        for n in names:
            cols = pending[n]
            if cols[tables.SCHEMAS[n].names[0]]:
                writers[n].write_table(to_table(n, cols))
                pending[n] = {f.name: [] for f in tables.SCHEMAS[n]}
        pending_rows = 0
        if not frozen:  # pyarrow has now imported pandas (at its first pa.array): freeze those objects too
            gc.freeze()
            frozen = True

    # Parsing allocates many dicts, so the cyclic GC runs often; without this every full collection
    # walks the objects of every imported module (pandas alone: ~10 % of ingest CPU). None of them
    # is garbage; ingest's own records are acyclic and freed by reference counting as before.
    gc.freeze()

    totals: Counter = Counter()
    secrets: Counter = Counter()
    files = 0
    try:
        for res in ingest_paths(args.paths, recipe):
            for n in names:
                for col, values in res.columns(n).items():
                    pending[n][col].extend(values)
            pending_rows += res.stats["messages"]
            if pending_rows >= FLUSH_ROWS:
                flush()
            for rep in res.file_reports:
                files += 1
                print(json.dumps(rep), flush=False)
            for k in ("states", "messages", "bad_lines", "subagents_linked", "compactions_crossed", "warmup_dropped", "streams"):
                totals[k] += res.stats.get(k, 0)
            totals["sessions"] += 1
            secrets.update(res.secrets)
        flush()
    finally:
        for n in names:
            writers[n].close()
            handles[n].close()
    print(json.dumps({"total": True, "files": files, **dict(totals), "secrets_scrubbed": dict(secrets), "out": store.url()}))
    sys.stdout.flush()
    return 0
