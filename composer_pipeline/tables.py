"""Column contracts of every table the pipeline stores (Parquet), by table name.

The table name is also the Dagster asset name and the DuckDB view name used by
``composer-pipeline sql``. Stages validate their output against these schemas with
:func:`conform`, so a column added in one stage is added here first.

JSON-valued columns (``action``, ``content``, ``prompt``, ...) are stored as UTF-8 strings:
nested messages vary in shape and must round-trip untouched through data-juicer and Parquet.
"""

from __future__ import annotations

import pyarrow as pa

_str = pa.string()
_strs = pa.list_(pa.string())
_ints = pa.list_(pa.int64())

# --- ingestion -----------------------------------------------------------------------------
TRACE_STATES = pa.schema(
    [
        # stable: sha256(session_key, stream_id, response key)[:20]
        ("state_id", _str),
        # Claude Code sessionId of the main session
        ("session_id", _str),
        # partition key (see ingest.discover.session_key)
        ("session_key", _str),
        # "<session_key>:main" | "<session_key>:agent-<id>" | "<session_key>:side-<root uuid>"
        ("stream_id", _str),
        # main | inline_sidechain | sibling_agent_file | subagents_dir
        ("stream_kind", _str),
        ("agent_id", _str),
        # Task/Agent tool_use id that spawned this stream
        ("parent_tool_use_id", _str),
        # relative to the trace root it was found under
        ("source_file", _str),
        # 1-based lines of the records that form the action
        ("source_lines", _ints),
        ("record_uuids", _strs),
        ("message_id", _str),
        ("request_id", _str),
        # last record before the action on its parentUuid chain
        ("prefix_leaf_uuid", _str),
        ("n_prefix_messages", pa.int64()),
        ("action", _str),  # JSON Action (actions.Action.to_json)
        # JSON list[{"tool_use_id", "tool_name", "content"}] or null
        ("error_after", _str),
        ("has_error", pa.bool_()),
        ("model", _str),
        ("version", _str),
        ("timestamp", _str),
        # JSON usage of the last record of the response
        ("usage", _str),
        # the agent that wrote the session: claude | codex
        ("source", _str),
    ]
)

TRACE_MESSAGES = pa.schema(
    [
        ("stream_id", _str),
        ("session_key", _str),
        # record uuid (salvaged from a damaged line where possible)
        ("uuid", _str),
        ("parent_uuid", _str),
        ("logical_parent_uuid", _str),  # compact_boundary stitching
        # user | assistant | system | progress | attachment | <unknown>
        ("record_type", _str),
        ("subtype", _str),
        # assistant grouping key: message.id, else requestId, else uuid
        ("message_key", _str),
        ("role", _str),
        ("is_meta", pa.bool_()),
        ("is_compact_summary", pa.bool_()),
        ("is_sidechain", pa.bool_()),
        ("source_file", _str),
        ("line_no", pa.int64()),
        ("timestamp", _str),
        # the scrubbed JSONL line: lineage, and the one copy of the record's payload
        ("raw", _str),
        ("source", _str),  # claude | codex
    ]
)
# The message payload (``message.content``, ``toolUseResult``) is stored once, inside ``raw``:
# render.record_payload decodes it, and the DuckDB view of this table (store.py) adds it as the JSON
# columns ``content`` and ``tool_use_result``.

QUARANTINE = pa.schema(
    [
        ("session_key", _str),
        ("source_file", _str),
        ("line_no", pa.int64()),  # 1-based; 0 for a whole-file problem
        ("reason", _str),
        ("text", _str),  # scrubbed, truncated
        ("salvaged_uuid", _str),
        ("salvaged_parent_uuid", _str),
        # claude | codex; null for a file in neither format
        ("source", _str),
    ]
)

# --- replay --------------------------------------------------------------------------------
COST_PLAN = pa.schema(
    [
        ("state_id", _str),
        ("teacher", _str),
        ("call_id", _str),
        ("cached", pa.bool_()),
        ("est_prompt_tokens", pa.int64()),
        ("worst_case_usd", pa.float64()),
        # expected cost with prompt caching (replay/plan.predict_cached)
        ("predicted_usd", pa.float64()),
        (
            "skip_reason",
            _str,
            # why this call is not sent (over_context_window: / no_user_turn: ...); null: sent or cached
        ),
    ]
)

# teacher_replays.finish_reason of an answer cut at its token limit (OpenAI ``length``, Anthropic ``max_tokens``)
CUT_FINISH_REASONS = ("length", "max_tokens")

TEACHER_REPLAYS = pa.schema(
    [
        # content address: sha256(teacher, model, base_url, request body)
        ("call_id", _str),
        ("state_id", _str),
        ("session_key", _str),
        ("teacher", _str),
        ("model", _str),
        # answered | refused | failed | budget_exhausted | skipped (never sent by design: reason)
        ("status", _str),
        # failure reason / parse error / cut_off / usage flag (null when answered and parsed)
        ("reason", _str),
        # JSON Action, null if not answered or unparseable
        ("action", _str),
        # the teacher's message content as received
        ("raw_answer", _str),
        # what this answer cost when it was bought (kept for cache hits)
        ("cost_usd", pa.float64()),
        # what THIS run paid for the row (0 for a cache hit or a shared answer)
        ("paid_usd", pa.float64()),
        ("reserved_usd", pa.float64()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("latency_s", pa.float64()),
        ("attempts", pa.int64()),
        ("cache_hit", pa.bool_()),
        ("created_at", _str),
        # prompt tokens the provider billed as cache reads (null: no usage)
        ("cached_tokens", pa.int64()),
        # prompt tokens billed as cache writes (Anthropic)
        ("cache_write_tokens", pa.int64()),
        # messages of the prefix elided to fit the teacher's window (0: sent whole)
        ("elided_messages", pa.int64()),
        # messages cut in their middle to fit the window
        ("cut_messages", pa.int64()),
        # the provider's stop reason in its word (stop, length, tool_calls, end_turn, max_tokens, refusal...);
        # an answer cut at its token limit (length, max_tokens) never votes (pairs/build.py)
        ("finish_reason", _str),
    ]
)

# --- pairs ---------------------------------------------------------------------------------
_PAIR_FIELDS = [
    # sha256(state_id, consensus signature)[:20]
    ("pair_id", _str),
    ("kind", _str),  # pair | positive
    ("state_id", _str),
    ("session_key", _str),
    (
        "partition_key",
        _str,
        # the short key the Dagster UI shows for the session (calc/a1f0c3d2; ids.with_partition_key)
    ),
    ("session_id", _str),
    ("source_file", _str),
    ("source_lines", _ints),
    ("record_uuids", _strs),
    ("replay_call_ids", _strs),
    # JSON list of OpenAI chat messages (render.render_prefix)
    ("prompt", _str),
    # JSON list of tool schemas offered to teachers
    ("tools", _str),
    ("chosen", _str),  # JSON Action (consensus representative)
    # JSON Action (the agent's); for positives: the agent's action too
    ("rejected", _str),
    ("chosen_text", _str),  # Action.to_text()
    ("rejected_text", _str),
    # cross_model (distinct models agree) | self_consistency (samples of one model)
    ("agreement_kind", _str),
    ("n_teachers", pa.int64()),  # teacher entries with a parsed answer
    # distinct models (base_url + model) among them
    ("n_models", pa.int64()),
    # distinct models whose answer is the consensus decision
    ("n_models_agreeing", pa.int64()),
    # votes in the consensus: models (cross_model) or samples (self_consistency)
    ("n_agreeing", pa.int64()),
    ("agreeing_teachers", _strs),
    ("agreement_score", pa.float64()),
    ("consensus_signature", _str),
    ("agent_signature", _str),
    ("cost_usd", pa.float64()),
    ("has_error", pa.bool_()),
    ("error_after", _str),
    # the agent whose session the state comes from: claude | codex
    ("source", _str),
]
DPO_PAIRS = pa.schema(_PAIR_FIELDS)
NORMALIZED_DPO_PAIRS = DPO_PAIRS
DROPPED_PAIRS = pa.schema(_PAIR_FIELDS + [("drop_op", _str), ("drop_reason", _str), ("drop_stats", _str)])

# Where a pair can live, and what that says about it (the order ``show`` and ``lineage`` list them in).
# how the teachers agreed on a pair's state: the columns `show` and `lineage` print as a pair's agreement
PAIR_AGREEMENT_FIELDS: tuple[str, ...] = (
    "agreement_kind",
    "n_teachers",
    "n_models",
    "n_models_agreeing",
    "n_agreeing",
    "agreeing_teachers",
    "agreement_score",
    "consensus_signature",
    "agent_signature",
    "cost_usd",
    "chosen_text",
    "rejected_text",
)

PAIR_TABLES: tuple[tuple[str, str], ...] = (
    ("normalized_dpo_pairs", "kept"),
    ("agreement_positives", "positive"),
    ("dropped_pairs", "dropped"),
    ("dpo_pairs", "built"),
)

SCHEMAS: dict[str, pa.Schema] = {
    "trace_states": TRACE_STATES,
    "trace_messages": TRACE_MESSAGES,
    "quarantine": QUARANTINE,
    "cost_plan": COST_PLAN,
    "teacher_replays": TEACHER_REPLAYS,
    "dpo_pairs": DPO_PAIRS,
    "normalized_dpo_pairs": NORMALIZED_DPO_PAIRS,
    "agreement_positives": DPO_PAIRS,
    "dropped_pairs": DROPPED_PAIRS,
}

# A table's one name is its key in SCHEMAS: the Dagster asset, the ``sql`` view, what ``show``, ``lineage``,
# ``pairs`` and ``train`` read. Three CLI commands write their flat ``--out`` file under an older short
# name, kept because scripts read those files by path (``replay --out D`` -> ``D/replays.parquet``,
# ``pairs --out D`` -> ``D/pairs.parquet`` and ``D/positives.parquet``); the Store reads such a file as
# the table (never as a table of its own name) and nothing else uses the short names.
FILE_ALIASES: dict[str, tuple[str, ...]] = {
    "teacher_replays": ("replays",),
    "normalized_dpo_pairs": ("pairs",),
    "agreement_positives": ("positives",),
}


def cli_file_name(name: str) -> str:
    """The stem of the flat file a CLI command writes table ``name`` to (see FILE_ALIASES)."""
    return FILE_ALIASES.get(name, (name,))[0]


# the agent of every table stored before the ``source`` column
LEGACY_SOURCE = "claude"


def conform(table: pa.Table, name: str) -> pa.Table:
    """Return ``table`` with exactly the columns of ``SCHEMAS[name]``, in order, cast to type.

    Missing nullable columns are an error: a stage must say what it means by each column. The one
    exception is ``source``: a table stored before the column (before Codex CLI sessions were read) is
    Claude Code's, and is read as such.
    """
    schema = SCHEMAS[name]
    if "source" in schema.names and "source" not in table.column_names:
        table = table.append_column("source", pa.array([LEGACY_SOURCE] * table.num_rows, pa.string()))
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise ValueError(f"{name}: missing columns {missing}")
    return table.select(schema.names).cast(schema)


def empty(name: str) -> pa.Table:
    # == SCHEMAS[name].empty_table(), which (like pa.array([])) imports pandas: ~0.3 CPU-s of an ingest run
    schema = SCHEMAS[name]
    return pa.Table.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)
