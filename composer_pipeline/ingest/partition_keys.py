"""Short, readable names for sessions: the Dagster partition keys (``<project>/<short id>``).

A session key (``ingest.discover.session_key``) is the main file's path under the trace root with
``/`` -> ``__``, e.g. ``-home-dev-calc__a1f0c3d2-1111-4a4a-8a8a-000000000001``: exact, part of every
``state_id``, and far too long for a partition list. The partition key of that session is
``calc/a1f0c3d2``: the project (the last directory, without Claude Code's encoded
``-home-<user>-`` / ``-Users-<user>-`` / ``C--Users-<user>-`` prefix) and the first 8 characters
of a UUID file name (other file names whole, up to 24 characters); a Codex rollout
(``rollout-<timestamp>-<uuid>.jsonl``) is ``codex/<first 8 of its session id>``. Nothing stored changes:
``state_id`` and every table keep the session key; only the partition (and its Parquet file,
``<asset>/<project>/<id>.parquet``) is named by the short key.

Candidates, per session and independent of any other: ``p/abcdef12``, ``p/abcdef12-``, ... the
whole id, then the id plus 8 hex of the session key's sha256. A new session gets its first
candidate that is no existing partition key and no candidate of any *other* session present,
so a key names one session when it is given; an older key is never changed by a newcomer
(collision -> the newcomer's id is longer). Reading a key back (``KeyMap``) resolves the
instance's partition keys against the sessions on disk: a key only one unresolved session can
have is that session's; repeated until nothing changes (the newest key resolves first, then the
older key it lengthened past); the one case keys alone cannot decide, a newcomer seen before it
has a key of its own, is settled by what the partition was materialized as (``pins``). Keys
without ``/`` are session keys (instances from before short keys): they keep naming their
session, and such a session gets no second, short partition.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# characters of a UUID file name in a key (32 bits: collisions are checked, not assumed away)
ID_LEN = 8
# longest project name / non-UUID id shown (longer ones keep their first characters)
NAME_MAX = 24

_UUIDISH = re.compile(r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
# Codex CLI names a session's file rollout-<timestamp>-<session id>.jsonl (under YYYY/MM/DD)
_ROLLOUT = re.compile(r"rollout-.+?-([0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})")
# also keeps Dagster's forbidden substrings ("...", controls) out
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
# Claude Code names a project directory after its cwd with "/" (and "\", ":", ".") -> "-"
_HOME_PREFIX = re.compile(r"^(?:[A-Za-z]--)?-?(?:home|Users|users|root)(?:-[^-]+)?-(?=.)")


def _safe(text: str) -> str:
    return _UNSAFE.sub("-", text).strip("-")


def split_session_key(session_key: str) -> tuple[str, str]:
    """(directory part, file stem) of a session key (``__`` stands for ``/``)."""
    head, sep, stem = session_key.rpartition("__")
    return (head, stem) if sep else ("", session_key)


def project_name(session_key: str) -> str:
    """The readable project of a session: its directory's last component without the home prefix
    (``codex`` for a Codex rollout)."""
    head, stem = split_session_key(session_key)
    return "codex" if _ROLLOUT.fullmatch(stem) else _project_of_dir(head)


# a handful of project directories for any number of sessions
@functools.lru_cache(maxsize=4096)
def _project_of_dir(head: str) -> str:
    last = head.rpartition("__")[2]
    name = _safe(_HOME_PREFIX.sub("", last)) or _safe(last)
    # "_": a session file directly under the trace root
    return name[:NAME_MAX].strip("-") or "_"


def _parts(session_key: str) -> tuple[str, str, int]:
    """(project, id, length of the id in the first candidate); a Codex rollout's is ``codex`` and its session id."""
    _, stem = split_session_key(session_key)
    rollout = _ROLLOUT.fullmatch(stem)
    if rollout:
        return "codex", rollout.group(1), ID_LEN
    ident = _safe(stem) or "session"
    return project_name(session_key), ident, ID_LEN if _UUIDISH.fullmatch(stem) else min(len(ident), NAME_MAX)


def _first_key(project: str, ident: str, start: int) -> str:
    return f"{project}/{ident[:start].rstrip('-')}"


def candidates(session_key: str) -> list[str]:
    """Every partition key this session may get, shortest first (see the module docstring)."""
    project, ident, start = _parts(session_key)
    out = [f"{project}/{ident[:n].rstrip('-')}" for n in range(start, len(ident) + 1)]
    out.append(f"{project}/{ident}-{hashlib.sha256(session_key.encode()).hexdigest()[:8]}")
    return list(dict.fromkeys(out))


def _lazy_candidates(session_key: str, first: str):
    yield first
    yield from candidates(session_key)[1:]  # built only on a collision


def is_short_key(partition_key: str) -> bool:
    """True for ``<project>/<id>`` keys; session keys (the long form) never hold a ``/``."""
    return "/" in partition_key


class PartitionKeyError(LookupError):
    """A partition key that names no session on disk."""


@dataclass
class KeyMap:
    """Partition key <-> session key for the sessions on disk and the partitions of an instance.

    ``session_keys``: what ``discover_sessions`` finds now; ``partition_keys``: the instance's
    ``sessions`` partitions; ``pins``: partition key -> session key recorded where a partition was
    materialized (``raw_sessions``' ``session_key`` metadata), which decides the one case the keys
    alone cannot: a newcomer whose id starts like an older key's (both are candidates of it until
    the newcomer has its own, longer key). Without a pin that tie goes to the smaller session key
    (listed in ``tied``, so a caller can look pins up and build the map again). ``assign()`` names
    the sessions that have no partition yet.
    """

    session_keys: Iterable[str]
    partition_keys: Iterable[str] = ()
    pins: Mapping[str, str] = field(default_factory=dict)
    session_of: dict[str, str] = field(init=False, default_factory=dict)  # partition key -> session key
    partition_of: dict[str, str] = field(init=False, default_factory=dict)  # session key -> partition key
    unresolved: dict[str, str] = field(init=False, default_factory=dict)  # partition key -> why
    tied: list[str] = field(init=False, default_factory=list)  # keys decided by the tie-break

    def __post_init__(self) -> None:
        self.session_keys = sorted(set(self.session_keys))
        self.partition_keys = sorted(set(self.partition_keys))
        sessions = set(self.session_keys)
        # every candidate of a session starts with its first one: index the first ones only, and
        # the lengths their ids have per project (one or two), so holders() is a few dict lookups
        self._part_cache: dict[str, tuple[str, str, int]] = {}
        self._first: dict[str, list[str]] = defaultdict(list)
        self._lengths: dict[str, set[int]] = defaultdict(set)
        for s in self.session_keys:
            project, ident, start = self._parts(s)
            first = _first_key(project, ident, start)
            self._first[first].append(s)
            self._lengths[project].add(len(first) - len(project) - 1)
        shorts, taken = [], set()
        for pk in self.partition_keys:
            pinned = self.pins.get(pk)
            if is_short_key(pk) and pinned in sessions and pinned not in taken:
                taken.add(pinned)
                self._name(pk, pinned)
            elif is_short_key(pk):
                shorts.append(pk)
            # a long key (before short keys): the session key itself
            elif pk in sessions:
                self.session_of[pk] = pk
                self.partition_of.setdefault(pk, pk)
            else:
                self.unresolved[pk] = "no session with this key under the trace root (moved or deleted?)"
        self._resolve(shorts, taken)

    def _parts(self, s: str) -> tuple[str, str, int]:
        p = self._part_cache.get(s)
        if p is None:
            p = self._part_cache[s] = _parts(s)
        return p

    def _is_candidate(self, key: str, s: str) -> bool:
        """``key in candidates(s)``, without building the list."""
        project, ident, start = self._parts(s)
        kp, _, kid = key.partition("/")
        if kp != project:
            return False
        if kid.startswith(ident + "-") and len(kid) == len(ident) + 9:  # the hashed last candidate
            return kid == f"{ident}-{hashlib.sha256(s.encode()).hexdigest()[:8]}"
        n = len(kid)
        return (
            n > 0 and ident.startswith(kid) and not kid.endswith("-") and (n >= start or set(ident[n:start]) == {"-"})
        )

    def holders(self, key: str) -> list[str]:
        """The sessions on disk that have ``key`` among their candidates (sorted)."""
        project, _, ident = key.partition("/")
        out: list[str] = []
        for n in sorted(self._lengths.get(project, ())):
            if n <= len(ident):
                out.extend(s for s in self._first.get(f"{project}/{ident[:n]}", ()) if self._is_candidate(key, s))
        return sorted(out)

    def _name(self, pk: str, s: str) -> None:
        self.session_of[pk] = s
        # a short key wins over a session's long one
        self.partition_of[s] = pk

    def _resolve(self, pending: list[str], taken: set[str]) -> None:
        while pending:
            progress, still = False, []
            for pk in pending:
                left = [s for s in self.holders(pk) if s not in taken]
                if len(left) == 1:
                    taken.add(left[0])
                    self._name(pk, left[0])
                    progress = True
                elif left:
                    still.append(pk)
                else:
                    self.unresolved[pk] = "no session with this name under the trace root (moved or deleted?)"
            # a tie: the first such key goes to its smaller session
            if still and not progress:
                pk = still.pop(0)
                s = min(x for x in self.holders(pk) if x not in taken)
                taken.add(s)
                self._name(pk, s)
                self.tied.append(pk)
            pending = still

    def assign(self) -> dict[str, str]:
        """Session key -> new partition key for every session without a partition (added to the map)."""
        used = set(self.partition_keys) | set(self.session_of)
        new: dict[str, str] = {}
        for s in self.session_keys:
            if s in self.partition_of:
                continue
            for c in _lazy_candidates(s, _first_key(*self._parts(s))):
                if c not in used and self.holders(c) == [s]:
                    break
            # the last candidate carries a hash of the whole session key: not reached in practice
            else:
                raise PartitionKeyError(f"no free partition key for session {s!r} (tried {candidates(s)})")
            new[s] = c
            used.add(c)
            self.session_of[c] = s
            self.partition_of[s] = c
        self.partition_keys = sorted(used)
        return new

    def session_key(self, partition_key: str) -> str:
        """The session a partition key names; a clear error when it names none (or, briefly, several)."""
        if partition_key in self.session_of:
            return self.session_of[partition_key]
        if not is_short_key(partition_key) and partition_key in self.session_keys:
            return partition_key  # a long key is the session key itself
        why = self.unresolved.get(partition_key, "not a partition of this instance")
        raise PartitionKeyError(f"partition {partition_key!r}: {why}")
