"""Ingest stage: ``raw_sessions`` (files observed on disk) -> ``trace_states`` + ``trace_messages``
+ ``quarantine`` (one multi-asset per session partition) with checks.

Calls ``composer_pipeline.ingest.pipeline.ingest_session``; this module only finds the session's
files, attaches metadata (row counts, states per stream, preview, secrets scrubbed per kind, one
rendered prefix as the teacher would receive it) and reports the checks: parse success ratio,
quarantine size, schema, and a secret scan of everything written (blocking: nothing with a
secret in it goes on to the teachers).
"""

import json
import os
from pathlib import Path

import dagster as dg
import pyarrow as pa

from assets.layout import GROUP, stage
from assets.metadata import counts, preview
from assets.partitions import session_check, session_keymap, sessions_partitions
from composer_pipeline import tables
from composer_pipeline.ingest.config import IngestRecipe
from composer_pipeline.ingest.discover import SessionFiles, discover_sessions, session_fingerprint
from composer_pipeline.ingest.partition_keys import KeyMap, PartitionKeyError, is_short_key
from composer_pipeline.ingest.pipeline import ingest_session
from composer_pipeline.ingest.remote import is_remote, local_root
from composer_pipeline.render import record_payload
from composer_pipeline.scrub import Scrubber
from composer_pipeline.show import render_markdown, state_views
from resources.recipes import PipelineRecipes

# (one group for every asset: assets/layout.py)
STAGE = stage("ingest")


def find_session(trace_root: str | list[str], partition_key: str, instance=None):
    """The session a ``sessions`` partition names, under one trace root or several (the first root
    holding a session key wins, as the sensor's scan): a short key (``calc/a1f0c3d2``) through the
    instance's partitions (``assets.partitions.session_keymap``), a long one (older instances) directly."""

    roots = [trace_root] if isinstance(trace_root, str) else trace_root
    found: dict[str, SessionFiles] = {}
    for root in roots:
        if len(roots) == 1 or is_remote(root) or Path(root).is_dir():
            for sf in discover_sessions(local_root(root)):
                found.setdefault(sf.key, sf)
    trace_root = ", ".join(roots)
    if not is_short_key(partition_key):
        if partition_key in found:
            return found[partition_key]
        raise FileNotFoundError(
            f"session {partition_key!r} not found under {trace_root} (was the file moved or deleted?)"
        )
    project = partition_key.split("/", 1)[0]
    keymap = session_keymap(instance, found, project) if instance is not None else KeyMap(found, [partition_key])
    try:
        return found[keymap.session_key(partition_key)]
    except PartitionKeyError as e:
        raise FileNotFoundError(f"{e} (trace root {trace_root})") from None


@dg.asset(
    partitions_def=sessions_partitions,
    group_name=GROUP,
    tags=STAGE,
    kinds={"file"},
    description="A session on disk: a Claude Code main JSONL file plus subagent files, or a Codex CLI rollout. Records the file "
    "list, sizes and a content fingerprint (the data version); the files themselves are not copied.",
)
def raw_sessions(context: dg.AssetExecutionContext, recipes: PipelineRecipes) -> dg.MaterializeResult:
    sf = find_session(recipes.roots(), context.partition_key, context.instance)
    files = sf.files
    sizes = {sf.rel(f): f.stat().st_size for f in files}
    fp = session_fingerprint(sf)
    return dg.MaterializeResult(
        metadata={
            "files": dg.MetadataValue.json({k: v for k, v in sizes.items()}),
            "n_files": len(files),
            "n_subagent_files": len(sf.subagent_files),
            "total_bytes": sum(sizes.values()),
            "fingerprint": fp,
            "trace_root": str(sf.root),
            # the partition key is short (project/id); these name the session in full
            "session_key": sf.key,
            # (as the tables name it: a folder or file name holding a secret is cleaned, discover.clean_name)
            "session_file": dg.MetadataValue.path(os.path.join(str(sf.root), sf.rel(sf.main_file or sf.files[0]))),
        },
        data_version=dg.DataVersion(fp),
    )


def render_options(recipes: PipelineRecipes):
    """The RenderOptions every stage uses (the ingest recipe's render section)."""

    return IngestRecipe.load(recipes.ingest).render


def _secret_hits(tbl: pa.Table, columns: list[str], extra_patterns: dict) -> dict[str, int]:
    """Secrets the scrubber would still find in what is about to be stored (should be none)."""

    scrubber = Scrubber(extra_patterns or None)
    for col in columns:
        for v in tbl.column(col).to_pylist():
            if v:
                scrubber.scrub(v)
    return {str(k): int(n) for k, n in dict(scrubber.counts).items() if n}


def _with_content(messages: pa.Table) -> pa.Table:
    """Rows of ``trace_messages`` with their message content (kept inside ``raw``) as a JSON column."""

    content = [
        record_payload(raw, t, source)[0]
        for raw, t, source in zip(
            messages.column("raw").to_pylist(),
            messages.column("record_type").to_pylist(),
            messages.column("source").to_pylist(),
        )
    ]
    return messages.append_column(
        "content", pa.array([None if c is None else json.dumps(c) for c in content], pa.string())
    )


def _rendered_example(states: pa.Table, messages: pa.Table, recipe) -> str:
    """The state view `composer-pipeline show` prints, in Markdown, for the session's middle state."""

    if states.num_rows == 0:
        return "*no states in this session*"
    state_id = states.column("state_id")[states.num_rows // 2].as_py()
    (view,) = state_views(states, messages, None, recipe.render, [state_id])
    return render_markdown(view, max_messages=8)


@dg.multi_asset(
    partitions_def=sessions_partitions,
    group_name=GROUP,
    deps=[raw_sessions],
    outs={
        "trace_states": dg.AssetOut(
            tags=STAGE,
            description="One row per agent action (assistant API response) with its prefix pointer.",
            kinds={"parquet"},
            is_required=True,
        ),
        "trace_messages": dg.AssetOut(
            tags=STAGE,
            description="Every scrubbed JSONL record of the session (render input and lineage).",
            kinds={"parquet"},
            is_required=True,
        ),
        "quarantine": dg.AssetOut(
            tags=STAGE,
            description="Lines that could not be used, with the reason (nothing is dropped silently).",
            kinds={"parquet"},
            is_required=True,
        ),
    },
    check_specs=[
        session_check("parse_success_ratio", asset="trace_states", description="Parsed lines / all lines ≥ threshold."),
        session_check("quarantine_count", asset="quarantine", description="Quarantined lines ≤ threshold."),
        session_check("schema", asset="trace_states", blocking=True, description="All three tables match tables.py."),
        session_check(
            "no_secrets",
            asset="trace_messages",
            blocking=True,
            description="Secret scan of the stored messages/states/quarantine finds nothing (blocks replay).",
        ),
    ],
)
def ingest_session_tables(context: dg.AssetExecutionContext, recipes: PipelineRecipes):
    recipe = IngestRecipe.load(recipes.ingest)
    sf = find_session(recipes.roots(), context.partition_key, context.instance)
    res = ingest_session(sf, recipe)
    states = tables.conform(res.states, "trace_states")
    messages = tables.conform(res.messages, "trace_messages")
    quarantine = tables.conform(res.quarantine, "quarantine")

    total_lines = messages.num_rows + quarantine.num_rows
    ratio = messages.num_rows / total_lines if total_lines else 1.0
    secrets = {str(k): int(v) for k, v in dict(res.secrets).items()}
    stats = {k: v for k, v in dict(res.stats).items() if isinstance(v, (int, float, str, bool))}

    yield dg.Output(
        states,
        output_name="trace_states",
        metadata={
            "dagster/row_count": states.num_rows,
            "states_per_stream": dg.MetadataValue.json(counts(states.column("stream_id").to_pylist())),
            "states_with_error_after": int(sum(bool(x) for x in states.column("has_error").to_pylist())),
            "preview": preview(states, ["state_id", "stream_id", "n_prefix_messages", "action", "has_error"]),
            "rendered_example": dg.MetadataValue.md(_rendered_example(states, messages, recipe)),
            "stats": dg.MetadataValue.json(stats),
            # native (the compiled engine) or python; why Python took the session over, if it did
            "ingest_engine": res.engine,
            **({"python_fallback_reason": res.fallback_reason} if res.fallback_reason else {}),
        },
    )
    yield dg.Output(
        messages,
        output_name="trace_messages",
        metadata={
            "dagster/row_count": messages.num_rows,
            "records_by_type": dg.MetadataValue.json(counts(messages.column("record_type").to_pylist())),
            "secrets_scrubbed": dg.MetadataValue.json(secrets),
            "secrets_scrubbed_total": sum(secrets.values()),
            "preview": preview(
                _with_content(messages.slice(0, 5)), ["stream_id", "line_no", "record_type", "role", "content"]
            ),
        },
    )
    yield dg.Output(
        quarantine,
        output_name="quarantine",
        metadata={
            "dagster/row_count": quarantine.num_rows,
            "reasons": dg.MetadataValue.json(counts(quarantine.column("reason").to_pylist())),
            "preview": preview(quarantine, ["source_file", "line_no", "reason", "text"]),
        },
    )

    yield dg.AssetCheckResult(
        check_name="parse_success_ratio",
        asset_key="trace_states",
        passed=ratio >= recipes.min_parse_success_ratio,
        metadata={
            "ratio": ratio,
            "parsed_lines": messages.num_rows,
            "quarantined_lines": quarantine.num_rows,
            "threshold": recipes.min_parse_success_ratio,
        },
    )
    yield dg.AssetCheckResult(
        check_name="quarantine_count",
        asset_key="quarantine",
        passed=quarantine.num_rows <= recipes.max_quarantine_rows,
        metadata={"quarantined": quarantine.num_rows, "threshold": recipes.max_quarantine_rows},
    )
    mismatches: dict[str, list[str]] = {}
    for name, t in (("trace_states", res.states), ("trace_messages", res.messages), ("quarantine", res.quarantine)):
        problems = []
        for f in tables.SCHEMAS[name]:
            if f.name not in t.column_names:
                problems.append(f"{f.name}: missing")
            elif t.schema.field(f.name).type not in (f.type, pa.null()):
                problems.append(f"{f.name}: {t.schema.field(f.name).type} (contract {f.type})")
        if problems:
            mismatches[name] = problems
    yield dg.AssetCheckResult(
        check_name="schema",
        asset_key="trace_states",
        passed=not mismatches,
        metadata={"mismatches": dg.MetadataValue.json(mismatches)},
    )
    leaked = {}
    for name, tbl, cols in (
        # (content and toolUseResult are stored inside raw)
        ("trace_messages", messages, ["raw"]),
        ("trace_states", states, ["action", "error_after"]),
        ("quarantine", quarantine, ["text"]),
    ):
        hits = _secret_hits(tbl, cols, recipe.extra_secret_patterns)
        if hits:
            leaked[name] = hits
    yield dg.AssetCheckResult(
        check_name="no_secrets",
        asset_key="trace_messages",
        passed=not leaked,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "secret_hits_by_table": dg.MetadataValue.json(leaked),
            "scrubbed_at_ingest": dg.MetadataValue.json(secrets),
        },
    )
