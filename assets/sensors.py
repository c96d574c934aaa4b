"""``sessions_sensor``: scans the trace root, adds one dynamic partition per session and requests
runs for new or changed sessions.

In: ``discover_sessions(trace_root)`` and ``session_fingerprint``. Out: ``SensorResult`` with
add-partition requests and one ``RunRequest`` per new/changed session (run_key
``<partition_key>:<fingerprint>``, so a changed file runs again and an unchanged one never does).
A new session's partition key is short and readable (``<project>/<id>``, see
``composer_pipeline.ingest.partition_keys``); a session an older instance knows by its long key
keeps that partition. The cursor maps session key -> last requested fingerprint. A session the cursor does not know yet
(every session on the first tick, or after the cursor was reset) whose chain already went through
(``normalized_dpo_pairs`` materialized, ``raw_sessions`` last materialized with the same fingerprint)
is recorded in the cursor without a run: it is done. One whose chain stopped (e.g. a failed cost
check) still gets its run.

``batch_collect_sensor`` (batch mode): the ledger's provider batches that Dagster runs recorded, mapped to
their partitions through the recording run's ``dagster/partition`` tag; for each partition whose batches all
ended (asked of the provider through ``replay.batch.batches_ended``) and whose ``teacher_replays`` was not
materialized since, one ``RunRequest`` (run_key ``batch-collect:<batch ids>``, ``#<n>`` for a retry after a
collecting run the provider did not answer). A batch recorded before its run's partition was last
materialized is done; one whose run is still going is left to it.
"""

import json
import time
from collections import defaultdict
from pathlib import Path

import dagster as dg

from assets.partitions import recorded_sessions, session_keymap, sessions_partitions
from composer_pipeline.ingest.discover import discover_sessions, session_fingerprint
from composer_pipeline.ingest.remote import local_root
from composer_pipeline.ledger.batches import batches_since
from composer_pipeline.replay.batch import batches_ended
from resources.ledger import LedgerResource
from resources.recipes import PipelineRecipes
from resources.teachers import TeachersResource


def scan_sessions(trace_root: str | list[str]) -> dict[str, str]:
    """session key -> fingerprint of everything under ``trace_root`` (one root or several: a key found
    under two roots is the first root's, as ``assets.ingest.find_session`` reads it)."""

    found: dict[str, str] = {}
    for root in [trace_root] if isinstance(trace_root, str) else trace_root:
        # (an s3:// root: its mirror, new/changed objects fetched)
        for sf in discover_sessions(local_root(root)):
            found.setdefault(sf.key, session_fingerprint(sf))
    return found


# the last asset of a session's chain (session_chain)
CHAIN_END = "normalized_dpo_pairs"


def materialized_fingerprints(instance, keys: list[str]) -> dict[str, str]:
    """partition key -> fingerprint of its latest ``raw_sessions`` materialization (keys never materialized: absent)."""
    return {
        pk: str(meta["fingerprint"])
        for pk, meta in recorded_sessions(instance, keys).items()
        if meta.get("fingerprint") is not None
    }


def build_sessions_sensor(
    target, minimum_interval_seconds: int = 60, trace_roots: str | list[str] | None = None
) -> dg.SensorDefinition:
    roots = [trace_roots] if isinstance(trace_roots, str) else list(trace_roots or [])
    where = ", ".join(f"`{r}`" for r in roots) if roots else "the trace roots"

    @dg.sensor(
        name="sessions_sensor",
        target=target,
        minimum_interval_seconds=minimum_interval_seconds,
        description=f"Watches {where} (`trace_roots` in recipes/pipeline.yaml, `$COMPOSER_TRACE_ROOT`): adds a "
        "`sessions` partition per new Claude Code session or Codex CLI rollout there and requests a run for each new or changed "
        f"session, every {minimum_interval_seconds} s. A tick that requests nothing is listed as '0 runs requested': "
        "hover it for the reason.",
        default_status=dg.DefaultSensorStatus.STOPPED,
    )
    def sessions_sensor(context: dg.SensorEvaluationContext, recipes: PipelineRecipes):
        roots = [r for r in recipes.roots() if "://" in r or Path(r).is_dir()]
        if not roots:
            return dg.SkipReason(
                f"trace root {', '.join(recipes.roots())} does not exist: set trace_roots in "
                "recipes/pipeline.yaml or COMPOSER_TRACE_ROOT"
            )
        seen = json.loads(context.cursor) if context.cursor else {}
        current = scan_sessions(roots)
        keymap = session_keymap(context.instance, current)
        # session key -> partition key, for sessions without a partition
        added = keymap.assign()
        pk = keymap.partition_of
        finished = set(context.instance.get_materialized_partitions(dg.AssetKey(CHAIN_END)))
        unknown = sorted(k for k in current if k not in seen and k not in added and pk[k] in finished)
        by_partition = materialized_fingerprints(context.instance, [pk[k] for k in unknown])
        done = {k: current[k] for k in unknown if by_partition.get(pk[k]) == current[k]}
        # already materialized with these very files: no run, just remembered
        seen = {**seen, **done}
        changed = sorted(k for k, fp in current.items() if seen.get(k) != fp)
        if not added and not changed:
            msg = f"{len(current)} sessions under {', '.join(roots)}, none new or changed"
            if not done:
                return dg.SkipReason(msg)
            return dg.SensorResult(
                skip_reason=f"{msg}; {len(done)} found already materialized",
                cursor=json.dumps({**seen, **current}, sort_keys=True),
            )
        return dg.SensorResult(
            run_requests=[dg.RunRequest(partition_key=pk[k], run_key=f"{pk[k]}:{current[k]}") for k in changed],
            dynamic_partitions_requests=[sessions_partitions.build_add_request(sorted(added.values()))]
            if added
            else [],
            cursor=json.dumps({**seen, **current}, sort_keys=True),
        )

    return sessions_sensor


# batches recorded this long ago are looked at (Anthropic keeps results 29 days)
COLLECT_WINDOW_S = 30 * 24 * 3600


def batch_partitions(instance, rows, since: float) -> tuple[dict[str, list], list[str]]:
    """partition key -> the batches in ``rows`` its ``teacher_replays`` still has to collect, and why others wait.

    A partition waits on the batches a Dagster run of it recorded, and on those its latest ``teacher_replays``
    observation lists (``live_batch_ids``: calls with the same content as another session's, already held by
    that session's batch), when its ``teacher_replays`` was not materialized since. A batch whose recording run
    is still going is left to it. Batches of other runs (the CLI's) are not Dagster's."""

    by_id = {r.id: r for r in rows}
    open_: dict[str, dict[str, object]] = defaultdict(dict)
    waiting: list[str] = []
    latest: dict[str, float] = {}

    def materialized(pk: str) -> float:
        if pk not in latest:
            recs = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("teacher_replays"), asset_partitions=[pk]), limit=1
            ).records
            latest[pk] = recs[0].timestamp if recs else 0.0
        return latest[pk]

    for row in rows:
        run = instance.get_run_by_id(row.run_id)
        pk = run.tags.get("dagster/partition") if run is not None else None
        if pk is None:
            continue
        if not run.is_finished:
            waiting.append(f"{pk}: batch {row.id[:8]} (its run {row.run_id[:8]} is still going)")
        elif materialized(pk) < row.created_at:
            open_[pk][row.id] = row
    for pk, (ts, ids) in _latest_observations(instance, since).items():
        if materialized(pk) < ts:
            open_[pk].update({b: by_id[b] for b in ids if b in by_id})
    return {pk: list(v.values()) for pk, v in open_.items() if v}, waiting


def _latest_observations(instance, since: float) -> dict[str, tuple[float, list[str]]]:
    """partition -> (time, ``live_batch_ids``) of its latest ``teacher_replays`` observation since ``since``."""
    out: dict[str, tuple[float, list[str]]] = {}
    cursor = None
    while True:
        res = instance.fetch_observations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("teacher_replays"), after_timestamp=since),
            limit=1000,
            cursor=cursor,
        )
        for rec in res.records:  # newest first
            obs = rec.asset_observation
            if obs is None or obs.partition is None or obs.partition in out:
                continue
            ids = obs.metadata.get("live_batch_ids")
            out[obs.partition] = (rec.timestamp, list(ids.value) if ids is not None else [])
        if not res.has_more:
            return out
        cursor = res.cursor


def collect_run_key(instance, partition: str, batches) -> str:
    """``batch-collect:<batch ids>``: a batch is collected by one run. A collecting run that still left calls
    pending (the provider did not answer it) records one more ``teacher_replays`` observation than the
    submitting run did; each such attempt adds ``#<n>`` so the sensor may request the collection again."""
    key = "batch-collect:" + ",".join(sorted(b.id for b in batches))
    since = min(b.created_at for b in batches)
    obs = instance.fetch_observations(
        dg.AssetRecordsFilter(
            asset_key=dg.AssetKey("teacher_replays"), asset_partitions=[partition], after_timestamp=since
        ),
        limit=1000,
    ).records
    return key if len(obs) <= 1 else f"{key}#{len(obs) - 1}"


def build_batch_collect_sensor(target, minimum_interval_seconds: int = 300) -> dg.SensorDefinition:
    @dg.sensor(
        name="batch_collect_sensor",
        target=target,
        minimum_interval_seconds=minimum_interval_seconds,
        description="Batch mode (`mode: batch` in the teachers recipe): reads the ledger's provider batches that "
        "`teacher_replays` runs submitted, asks each provider whether they ended, and requests a run "
        "materializing `teacher_replays` (and its pairs) for each partition whose batches all ended (run key: "
        f"their batch ids, so a batch is collected once), every {minimum_interval_seconds} s.",
        default_status=dg.DefaultSensorStatus.STOPPED,
    )
    def batch_collect_sensor(context: dg.SensorEvaluationContext, teachers: TeachersResource, ledger: LedgerResource):
        since = time.time() - COLLECT_WINDOW_S
        rows = batches_since(ledger.open(), since)
        by_partition, waiting = batch_partitions(context.instance, rows, since)
        if not by_partition:
            return dg.SkipReason("; ".join(["no provider batch of a Dagster run to collect", *waiting]))
        # a batch two partitions wait on: asked once
        unique = {r.id: r for v in by_partition.values() for r in v}
        ended = batches_ended(teachers.load_config(), teachers.api_key_values(), list(unique.values()))
        requests, pending = [], list(waiting)
        for pk, batches in sorted(by_partition.items()):
            not_yet = [f"batch {b.id[:8]} of {b.teacher}: {ended[b.id]}" for b in batches if ended[b.id] != "ended"]
            if not_yet:
                pending.append(f"{pk}: " + ", ".join(not_yet))
                continue
            requests.append(dg.RunRequest(partition_key=pk, run_key=collect_run_key(context.instance, pk, batches)))
        if not requests:
            return dg.SkipReason("still pending: " + "; ".join(pending))
        return dg.SensorResult(run_requests=requests, skip_reason=None)

    return batch_collect_sensor
