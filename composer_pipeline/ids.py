"""Ids a user types: one resolver for ``show`` and ``lineage`` (same rules, same error wording).

In:  what the user typed, the ids it may name (by kind: ``state``, ``pair``) and where they were read
     from; or a session named by its session key or by the short partition key the Dagster UI shows
     (``calc/a1f0c3d2``, :mod:`composer_pipeline.ingest.partition_keys`).
Out: ``(kind, full id)``; the session key; the short key of each stored session, and a table with it
     as a ``partition_key`` column (the pair tables carry it beside ``session_key``). Bad input is a
     ``ValueError`` (or the caller's subclass) that says what was searched where.

Deliberately simplified: the short key of a stored session is computed from the sessions in the
store (:class:`KeyMap` without an instance's history); an instance that named a colliding session
first may show a longer key for it, which resolves here too (every candidate of a session does).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING

from composer_pipeline.ingest.partition_keys import KeyMap, is_short_key

if TYPE_CHECKING:
    import pyarrow as pa

# characters of an id prefix (20-hex ids: a 6-char prefix is unique in practice)
MIN_PREFIX = 6


def resolve_id(
    raw: str, ids: Mapping[str, Collection[str]], where: str, error: type[ValueError] = ValueError
) -> tuple[str, str]:
    """``(kind, full id)`` for ``raw``: an exact id of one of ``ids``' kinds, else a unique prefix of at
    least :data:`MIN_PREFIX` characters across all of them."""
    kinds = " or ".join(ids)
    q = raw.strip().lower()
    if len(q) < MIN_PREFIX:
        raise error(f"id {raw!r} too short: give at least {MIN_PREFIX} characters of a {kinds} id")
    for kind, values in ids.items():
        if q in values:
            return kind, q
    hits = [(kind, v) for kind, values in ids.items() for v in sorted(values) if v.startswith(q)]
    if not hits:
        searched = ", ".join(f"{len(values)} {kind}s" for kind, values in ids.items())
        raise error(f"no {kinds} with id {raw!r} under {where} ({searched} searched)")
    if len(hits) > 1:
        shown = ", ".join(f"{k} {i}" for k, i in hits[:10])
        raise error(f"id prefix {raw!r} is ambiguous under {where}: {shown}{' ...' if len(hits) > 10 else ''}")
    return hits[0]


def session_of(raw: str, session_keys: Iterable[str], where: str, error: type[ValueError] = ValueError) -> str | None:
    """The session ``raw`` names: a session key, or a short partition key (``<project>/<id>``) of exactly
    one stored session; None when ``raw`` looks like neither (an id, for :func:`resolve_id`)."""

    sessions = sorted(set(session_keys))
    key = raw.strip()
    if key in sessions:
        return key
    if not is_short_key(key):
        return None
    holders = KeyMap(sessions).holders(key)
    if not holders:
        raise error(f"no session with partition key {raw!r} under {where} ({len(sessions)} sessions searched)")
    if len(holders) > 1:
        raise error(f"partition key {raw!r} is ambiguous under {where}: sessions {', '.join(holders[:10])}")
    return holders[0]


def partition_keys(session_keys: Iterable[str], stored: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """Session key -> the short partition key the Dagster UI shows for it (``calc/a1f0c3d2``). ``stored``
    (session key -> the key a table recorded, e.g. a pair table's ``partition_key``) wins: Dagster named
    those sessions; the others get the key :class:`KeyMap` assigns beside them."""

    pins = {k: s for s, k in (stored or {}).items() if k and s}
    keymap = KeyMap(set(session_keys) | set(pins.values()), partition_keys=pins, pins=pins)
    keymap.assign()
    return dict(keymap.partition_of)


def with_partition_key(table: pa.Table, partition_of: Mapping[str, str] | None = None) -> pa.Table:
    """``table`` with a ``partition_key`` column: kept where it is already filled; else the session's key in
    ``partition_of`` (session key -> partition key; Dagster gives the run's own partition), else the one
    :func:`partition_keys` computes over the table's sessions (pair tables written before the column)."""
    import pyarrow as pa

    sessions = table.column("session_key").to_pylist()
    have = (
        table.column("partition_key").to_pylist() if "partition_key" in table.column_names else [None] * len(sessions)
    )
    if "partition_key" in table.column_names and all(have):
        return table
    keys = dict(partition_of or {})
    rest = {s for s, k in zip(sessions, have) if not k and s and s not in keys}
    keys.update(partition_keys(rest) if rest else {})
    col = pa.array([k or keys.get(s) for s, k in zip(sessions, have)], pa.string())
    if "partition_key" in table.column_names:
        return table.set_column(table.column_names.index("partition_key"), "partition_key", col)
    return table.append_column("partition_key", col)
