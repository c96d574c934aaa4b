"""Pairs stage: ``dpo_pairs`` + ``agreement_positives`` (teacher consensus vs the agent; pairs whose chosen
side parrots the prompt or repeats its last tool call to ``pairs_dropped_at_build``, with the reason) ->
``normalized_dpo_pairs`` + ``dropped_pairs`` (data-juicer) -> ``training_set`` (all sessions).

Calls ``composer_pipeline.pairs.build.build_pairs`` and ``pairs.normalize.normalize_pairs``. Checks
(on the normalized pairs, where training reads them): schema, no empty chosen/rejected,
chosen != rejected, every pair resolves to a raw JSONL line of ``trace_messages`` (lineage), drop
rate within the configured bound. ``training_set`` is unpartitioned and tolerates sessions whose
pairs are not materialized yet (``allow_missing_partitions``).
"""

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc

from assets.ingest import render_options
from assets.layout import GROUP, stage
from assets.metadata import counts, preview
from assets.partitions import session_check, sessions_partitions
from composer_pipeline import tables
from composer_pipeline.ids import with_partition_key
from composer_pipeline.pairs.build import agreement_label, build_pairs
from composer_pipeline.pairs.config import NormalizeRecipe, PairRecipe
from composer_pipeline.pairs.normalize import normalize_pairs
from composer_pipeline.show import pair_views, render_markdown
from resources.recipes import PipelineRecipes
from resources.teachers import TeachersResource

# (one group for every asset: assets/layout.py)
STAGE = stage("pairs")
PAIR_PREVIEW = ["pair_id", "agreement_kind", "agreement", "chosen_text", "rejected_text"]


def pair_preview(table: pa.Table, columns=PAIR_PREVIEW) -> dg.MetadataValue:
    """The preview table with an `agreement` column that says which kind and how many agreed."""
    if table.num_rows and "agreement" in columns:
        head = table.slice(0, 5)
        labels = [agreement_label(r) for r in head.to_pylist()]
        table = head.append_column("agreement", pa.array(labels, pa.string()))
    return preview(table, columns)


def kinds_md(table: pa.Table) -> dict:
    return counts(table.column("agreement_kind").to_pylist()) if table.num_rows else {}


def _scalar_stats(stats: dict) -> dict:
    return {k: v for k, v in dict(stats).items() if isinstance(v, (int, float, str, bool, dict, list))}


def example_pair_md(
    pairs: pa.Table,
    table: str,
    states: pa.Table | None = None,
    messages: pa.Table | None = None,
    replays: pa.Table | None = None,
    opts=None,
) -> str:
    """The pair view `composer-pipeline show` prints, in Markdown, for the partition's first pair."""

    if pairs.num_rows == 0:
        return "*no pairs in this partition*"
    (view,) = pair_views(pairs, states, messages, replays, opts, table, [pairs.column("pair_id")[0].as_py()])
    return render_markdown(view, max_messages=3)


@dg.multi_asset(
    partitions_def=sessions_partitions,
    group_name=GROUP,
    outs={
        "dpo_pairs": dg.AssetOut(
            tags=STAGE, kinds={"parquet"}, description="States where teachers agree and the agent did something else."
        ),
        "agreement_positives": dg.AssetOut(
            tags=STAGE, kinds={"parquet"}, description="States where the teachers agree with the agent."
        ),
        "pairs_dropped_at_build": dg.AssetOut(
            tags=STAGE,
            kinds={"parquet"},
            description="Pairs never built, with the reason: the chosen side echoes prompt markup, parrots the prompt "
            "or repeats the prompt's last tool call word for word (drop_op pairs.build). Folded into dropped_pairs, as the CLI's `pairs` writes it.",
        ),
    },
)
def consensus_pairs(
    context: dg.AssetExecutionContext,
    trace_states: pa.Table,
    trace_messages: pa.Table,
    teacher_replays: pa.Table,
    recipes: PipelineRecipes,
    teachers: TeachersResource,
):
    sessions = set(trace_states.column("session_key").to_pylist())  # this partition's session
    res = build_pairs(
        trace_states,
        trace_messages,
        teacher_replays,
        PairRecipe.load(recipes.pairs),
        render_options(recipes),
        teachers=teachers.load_config(),
        partition_of=dict.fromkeys(sessions, context.partition_key),
    )
    pairs = tables.conform(res.pairs, "dpo_pairs")
    positives = tables.conform(res.positives, "agreement_positives")
    stats = _scalar_stats(res.stats)
    yield dg.Output(
        pairs,
        output_name="dpo_pairs",
        metadata={
            "dagster/row_count": pairs.num_rows,
            # pairs whose chosen side echoed prompt markup or parroted the prompt: never a pair, said here
            "dropped_at_build": dg.MetadataValue.json(counts(res.dropped.column("drop_reason").to_pylist())),
            "pairs_by_agreement_kind": dg.MetadataValue.json(kinds_md(pairs)),
            "stats": dg.MetadataValue.json(stats),
            "preview": pair_preview(pairs),
            "example": dg.MetadataValue.md(
                example_pair_md(
                    pairs, "dpo_pairs", trace_states, trace_messages, teacher_replays, render_options(recipes)
                )
            ),
        },
    )
    yield dg.Output(
        positives,
        output_name="agreement_positives",
        metadata={
            "dagster/row_count": positives.num_rows,
            "positives_by_agreement_kind": dg.MetadataValue.json(kinds_md(positives)),
            "preview": pair_preview(positives),
        },
    )
    at_build = tables.conform(res.dropped, "dropped_pairs")
    yield dg.Output(
        at_build,
        output_name="pairs_dropped_at_build",
        metadata={
            "dagster/row_count": at_build.num_rows,
            "drops_by_reason": dg.MetadataValue.json(counts(at_build.column("drop_reason").to_pylist())),
        },
    )


def _unresolved(pairs: pa.Table, messages: pa.Table) -> list[str]:
    """pair_ids whose record_uuids/source lines are not all present in trace_messages."""
    uuids = set(messages.column("uuid").to_pylist())
    lines = set(zip(messages.column("source_file").to_pylist(), messages.column("line_no").to_pylist()))
    bad = []
    for r in pairs.select(["pair_id", "record_uuids", "source_file", "source_lines"]).to_pylist():
        ok = bool(r["record_uuids"]) and all(u in uuids for u in r["record_uuids"])
        ok = ok and bool(r["source_lines"]) and all((r["source_file"], n) in lines for n in r["source_lines"])
        if not ok:
            bad.append(r["pair_id"])
    return bad


@dg.multi_asset(
    partitions_def=sessions_partitions,
    group_name=GROUP,
    outs={
        "normalized_dpo_pairs": dg.AssetOut(
            tags=STAGE, kinds={"parquet"}, description="Pairs kept by the data-juicer normalization."
        ),
        "dropped_pairs": dg.AssetOut(
            tags=STAGE, kinds={"parquet"}, description="Pairs removed, with the op and reason."
        ),
    },
    check_specs=[
        session_check(
            "schema", asset="normalized_dpo_pairs", blocking=True, description="Columns and types match tables.py."
        ),
        session_check(
            "non_empty_chosen_rejected",
            asset="normalized_dpo_pairs",
            blocking=True,
            description="Every kept pair has a non-blank chosen and rejected text.",
        ),
        session_check(
            "chosen_differs_from_rejected",
            asset="normalized_dpo_pairs",
            blocking=True,
            description="No kept pair prefers an action over the identical action.",
        ),
        session_check(
            "resolves_to_raw_lines",
            asset="normalized_dpo_pairs",
            blocking=True,
            description="Every pair's records and source lines exist in trace_messages.",
        ),
        session_check("drop_rate", asset="dropped_pairs", description="Dropped / all pairs ≤ threshold."),
    ],
)
def normalized_pairs(
    context: dg.AssetExecutionContext,
    dpo_pairs: pa.Table,
    pairs_dropped_at_build: pa.Table,
    trace_states: pa.Table,
    trace_messages: pa.Table,
    teacher_replays: pa.Table,
    recipes: PipelineRecipes,
):
    res = normalize_pairs(dpo_pairs, NormalizeRecipe.load(recipes.normalize))
    schema_ok = set(tables.NORMALIZED_DPO_PAIRS.names) <= set(res.kept.column_names)
    kept = tables.conform(res.kept, "normalized_dpo_pairs")
    # the build's drops first, then data-juicer's: the same rows as the CLI's `pairs` writes
    dropped = pa.concat_tables(
        [tables.conform(pairs_dropped_at_build, "dropped_pairs"), tables.conform(res.dropped, "dropped_pairs")]
    )
    yield dg.Output(
        kept,
        output_name="normalized_dpo_pairs",
        metadata={
            "dagster/row_count": kept.num_rows,
            "input_pairs": dpo_pairs.num_rows,
            "pairs_by_agreement_kind": dg.MetadataValue.json(kinds_md(kept)),
            "stats": dg.MetadataValue.json(_scalar_stats(res.stats)),
            "preview": pair_preview(kept),
            # the same view as on dpo_pairs (where the README sends auditors): state, agent and every teacher's answer
            "example": dg.MetadataValue.md(
                example_pair_md(
                    kept, "normalized_dpo_pairs", trace_states, trace_messages, teacher_replays, render_options(recipes)
                )
            ),
        },
    )
    yield dg.Output(
        dropped,
        output_name="dropped_pairs",
        metadata={
            "dagster/row_count": dropped.num_rows,
            "drops_by_op": dg.MetadataValue.json(counts(dropped.column("drop_op").to_pylist())),
            "drops_by_reason": dg.MetadataValue.json(counts(dropped.column("drop_reason").to_pylist())),
            "preview": preview(dropped, ["pair_id", "drop_op", "drop_reason", "chosen_text"]),
        },
    )
    yield dg.AssetCheckResult(
        check_name="schema",
        asset_key="normalized_dpo_pairs",
        passed=schema_ok,
        metadata={"columns": dg.MetadataValue.json(res.kept.column_names)},
    )
    empty = [
        r["pair_id"]
        for r in kept.select(["pair_id", "chosen_text", "rejected_text"]).to_pylist()
        if not (r["chosen_text"] or "").strip() or not (r["rejected_text"] or "").strip()
    ]
    yield dg.AssetCheckResult(
        check_name="non_empty_chosen_rejected",
        asset_key="normalized_dpo_pairs",
        passed=not empty,
        metadata={"empty": len(empty), "pair_ids": dg.MetadataValue.json(empty[:20])},
    )
    same = kept.filter(pc.equal(kept.column("chosen"), kept.column("rejected"))).column("pair_id").to_pylist()
    yield dg.AssetCheckResult(
        check_name="chosen_differs_from_rejected",
        asset_key="normalized_dpo_pairs",
        passed=not same,
        metadata={"identical": len(same), "pair_ids": dg.MetadataValue.json(same[:20])},
    )
    bad = _unresolved(kept, trace_messages)
    yield dg.AssetCheckResult(
        check_name="resolves_to_raw_lines",
        asset_key="normalized_dpo_pairs",
        passed=not bad,
        metadata={"unresolved": len(bad), "pair_ids": dg.MetadataValue.json(bad[:20])},
    )
    total = kept.num_rows + dropped.num_rows
    rate = dropped.num_rows / total if total else 0.0
    yield dg.AssetCheckResult(
        check_name="drop_rate",
        asset_key="dropped_pairs",
        passed=rate <= recipes.max_pair_drop_rate,
        metadata={
            "drop_rate": rate,
            "dropped": dropped.num_rows,
            "kept": kept.num_rows,
            "threshold": recipes.max_pair_drop_rate,
        },
    )


@dg.asset(
    group_name=GROUP,
    tags=STAGE,
    kinds={"parquet"},
    ins={
        "normalized_dpo_pairs": dg.AssetIn(metadata={"allow_missing_partitions": True}),
        "agreement_positives": dg.AssetIn(metadata={"allow_missing_partitions": True}),
    },
    description="Every session's normalized pairs (kind=pair) and agreement positives (kind=positive) in one "
    "table: what the trainer reads. Sessions not yet materialized are skipped and listed in metadata.",
)
def training_set(context: dg.AssetExecutionContext, normalized_dpo_pairs: dict, agreement_positives: dict) -> dg.Output:
    # (partitions materialized before pair tables had partition_key get it here: the key they are stored under)
    parts = [
        tables.conform(with_partition_key(t[k], dict.fromkeys(t[k].column("session_key").to_pylist(), k)), "dpo_pairs")
        for t in (normalized_dpo_pairs, agreement_positives)
        for k in sorted(t)
    ]
    table = tables.conform(pa.concat_tables(parts), "dpo_pairs") if parts else tables.empty("dpo_pairs")
    all_keys = context.instance.get_dynamic_partitions(sessions_partitions.name)
    included = sorted(set(normalized_dpo_pairs) | set(agreement_positives))
    return dg.Output(
        table,
        metadata={
            "dagster/row_count": table.num_rows,
            "rows_by_kind": dg.MetadataValue.json(counts(table.column("kind").to_pylist())),
            "pairs_by_session": dg.MetadataValue.json(
                {k: normalized_dpo_pairs[k].num_rows for k in sorted(normalized_dpo_pairs)}
            ),
            "partitions_included": dg.MetadataValue.json(included),
            "partitions_missing": dg.MetadataValue.json(sorted(set(all_keys) - set(included))),
            "rows_by_agreement_kind": dg.MetadataValue.json(kinds_md(table)),
            "preview": pair_preview(table, ["kind", *PAIR_PREVIEW]),
        },
    )
