"""Partitions: one dynamic partition per Claude Code session (main file + its subagent files).

Keys are short and readable, ``<project>/<id>`` (``composer_pipeline.ingest.partition_keys``:
deterministic, collision-checked, stable); ``raw_sessions`` records the full session key and file.
Instances from before short keys keep their long keys (the session key itself): both are read.
The sensor (and the demo) add keys through ``session_keymap(...).assign()``.
"""

import warnings

import dagster as dg

from composer_pipeline.ingest.partition_keys import KeyMap, project_name

# Checks of partitioned assets are declared per partition (AssetCheckSpec(partitions_def=...)), so each
# result names its session in the UI; Dagster 1.13 marks that argument "preview" and would print the
# warning in every run's log. Only that one warning is silenced.
warnings.filterwarnings("ignore", message=r".*partitions_def on an AssetCheckSpec.*", category=dg.PreviewWarning)
warnings.filterwarnings("ignore", message=r".*partitions_def.*asset_check.*", category=dg.PreviewWarning)

# the dynamic partitions' name, one per session
SESSIONS = "sessions"
sessions_partitions = dg.DynamicPartitionsDefinition(name=SESSIONS)


def session_check(name: str, *, asset: str, description: str, blocking: bool = False) -> dg.AssetCheckSpec:
    """A check of a session-partitioned asset, reported per session partition (the UI names its session)."""
    return dg.AssetCheckSpec(
        name, asset=asset, description=description, blocking=blocking, partitions_def=sessions_partitions
    )


def recorded_sessions(instance, partition_keys: list[str], page: int = 1000) -> dict[str, dict]:
    """partition key -> metadata of its latest ``raw_sessions`` materialization (as plain values)."""
    out: dict[str, dict] = {}
    for i in range(0, len(partition_keys), page):
        chunk, cursor = partition_keys[i : i + page], None
        while True:
            res = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("raw_sessions"), asset_partitions=chunk),
                limit=page,
                cursor=cursor,
            )
            # newest first: keep the first seen per partition
            for rec in res.records:
                mat = rec.asset_materialization
                if mat is not None and mat.partition not in out:
                    out[mat.partition] = {k: v.value for k, v in mat.metadata.items()}
            if not res.has_more:
                break
            cursor = res.cursor
    return out


def session_keymap(instance, session_keys, project: str | None = None):
    """The instance's ``sessions`` partitions resolved against ``session_keys`` (those on disk);
    where only a recorded materialization can tell which session a key names, it is looked up.
    ``project``: only that project's sessions and short keys (keys never cross projects)."""

    partitions = instance.get_dynamic_partitions(sessions_partitions.name)
    if project is not None:
        session_keys = [k for k in session_keys if project_name(k) == project]
        partitions = [k for k in partitions if k.startswith(project + "/")]
    keymap = KeyMap(session_keys, partitions)
    if keymap.tied:
        pins = {
            pk: str(meta["session_key"])
            for pk, meta in recorded_sessions(instance, list(keymap.tied)).items()
            if "session_key" in meta
        }
        keymap = KeyMap(session_keys, partitions, pins=pins)
    return keymap
