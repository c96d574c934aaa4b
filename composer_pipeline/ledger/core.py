"""The money state machine: claims, reservations and run leases over the ledger's tables.

In:  a ledger URL (see :mod:`~composer_pipeline.ledger.backends`), and from a replay run: the
     requests it needs (``call_id``), their worst-case prices, its teachers' budgets and its run ceiling.
Out: :class:`Ledger`, whose transactions write ``reservations``, ``claims``, ``runs``, ``waiters`` and the
     running sums in ``totals``; reads ``spent``/``room``/``balance``/``open_reservations``/``answer``.

Money rules (the replay client follows them):

* **claim** a request (unique key = its ``call_id``, the cache key) before buying it: a second run
  that needs the same answer waits for the claimant and takes the answer instead of sending. A claim
  whose run died (lease expired) or that failed is taken over; only a claimant dying mid-flight can
  cause a second purchase.
* **reserve** the worst case before sending. It is granted when ``settled + kept + reserved ≤ budget``
  (and the same for the run ceiling) after serving the waiters of the same teacher that rank before
  it: the run holding the least money in flight first, then first come first served (fair share across
  processes: no run starves). When only money *held by calls in flight* is in the way the
  caller **waits** for them to settle; ``budget_exhausted`` only when ``settled + kept`` alone leaves no
  room.
* **mark sent** just before the request leaves; **settle** at the reported usage (in the same
  transaction the answer is stored in its claim, so a paid answer is durable before anything else
  can fail), **keep** when the outcome is unknown (counted at the worst case forever, labelled),
  **release** when the request certainly was not billed.
* **leases**: a run heartbeats (``lease_s`` in the teachers recipe). A run whose lease expired is
  finalized by :meth:`Ledger.reconcile` (any process does it while waiting, or ``composer-pipeline
  teachers reconcile``): never-sent reservations are released, sent ones are kept at their worst case
  with the note ``lease expired: outcome unknown``, its claims and waits are dropped. A run whose process
  is gone is finalized at once, judged only from the same machine and PID namespace (:func:`machine_id`):
  a hostname is shared by containers, pods and machines named alike.
* **owners**: a run id is held by one process at a time (``runs.owner``, a token; :meth:`Ledger.start_run`
  refuses another live owner, :class:`RunIdInUse`), and a claim belongs to that owner. With an owner a
  reservation and its *mark sent* are granted only while the run holds its lease and the claim, in the same
  transaction: a run paused past its lease and finalized meanwhile learns it just before it would buy
  what another run took over (``Reservation.lost`` / ``mark_sent`` False). A settle that arrives after
  its reservation was finalized still counts, at its actual cost (:meth:`Ledger.close`).

Time comes from the database's clock, so leases agree across hosts. A teacher name has one identity per
ledger (``teacher_identities``, :meth:`Ledger.check_identities`). DuckDB stays the SQL engine over the
Parquet tables; it is not used here.

Deliberately simplified: dollars are floats (sums compared with ``EPS`` slack, running totals rounded to
1e-12 when read), not decimal cents; a reservation that has to wait is retried by its caller
(:meth:`Ledger.try_reserve` once per attempt), not notified; the fair-share order is recomputed from the
``waiters`` table on every attempt.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from composer_pipeline import home
from composer_pipeline.ledger.backends import Cursor, LedgerDatabase, LedgerError
from composer_pipeline.ledger.schema import migrate
from composer_pipeline.teachers.config import TeachersConfig, split_user_info

# float slack when comparing sums of dollars
EPS = 1e-12
# one home: the teachers recipe's defaults
DEFAULT_LEASE_S = TeachersConfig.lease_s
DEFAULT_OUTAGE_S = (
    TeachersConfig.ledger_outage_s
    # a PostgreSQL restart or failover takes seconds; a server down longer stops the run
)
# batched: held by a provider batch, not a run (ledger/batches.py)
OPEN_STATES = ("reserved", "sent", "batched")


@dataclass
class Reserve:
    teacher: str
    budget_usd: float
    run_id: str
    ceiling_usd: float
    amount_usd: float
    call_id: str = ""
    # the run's owner token (AsyncLedger): then the run must hold its lease and the call's claim
    owner: str = ""


@dataclass(frozen=True)
class Reservation:
    ok: bool
    id: str
    # why it was refused (or, with wait=True, what it waits for)
    reason: str = ""
    # not granted yet: money held by calls in flight or earlier waiters
    wait: bool = False
    # refused because the run lost its lease or the call's claim (paused past its lease)
    lost: bool = False


@dataclass(frozen=True)
class Claim:
    # mine | answered | wait | batched (held by a live provider batch: not bought here)
    state: str
    record: dict[str, Any] | None = None  # the answer, when answered
    owner: str = ""  # the run holding it, when wait


@dataclass(frozen=True)
class Balance:
    teacher: str
    budget_usd: float
    # settled + kept + reserved (what the budget check counts)
    spent_usd: float
    settled_usd: float
    kept_usd: float
    reserved_usd: float  # held by calls in flight
    remaining_usd: float
    kept_calls: int

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 8) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


class TeacherIdentityError(ValueError):
    """A recipe gives a teacher name the ledger already knows a different identity (base_url, model, prices)."""


class RunIdInUse(LedgerError):
    """Another live process holds this run id: two processes under one id would share its claims."""

    def __init__(self, message: str, lease_s: float = DEFAULT_LEASE_S):
        super().__init__(message)
        # the holder's lease: how long it may go without a heartbeat before it is dead
        self.lease_s = lease_s


def machine_id() -> str | None:
    """The machine and PID namespace this process's pid belongs to (``<boot id>/pidns:<inode>``): a pid says
    whether a run is alive only to a process with the same one (containers and pods on one node, or two
    machines named alike, share a hostname but not this). None where the system does not tell (not Linux):
    such runs are judged by their lease alone."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{boot}/pidns:{namespace}" if boot else None


# What the fields an older identity lacks meant when it was written (field-by-field comparison): before
# ``api`` every teacher spoke the OpenAI protocol; before cache prices cached and cache-write tokens cost the
# input price (what ``TeacherConfig`` still assumes when they are not set).
IDENTITY_DEFAULTS = {
    "api": lambda ident: "openai",
    "cached_input_usd_per_mtok": lambda ident: ident.get("input_usd_per_mtok"),
    "cache_write_usd_per_mtok": lambda ident: ident.get("input_usd_per_mtok"),
}


def _without_user_info(identity: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``identity`` with any user info (``user:password@``) taken out of its ``base_url``, and whether it had
    some: older code stored the URL as the recipe gave it, password included."""
    url = identity.get("base_url")
    if not isinstance(url, str):
        return identity, False
    clean, auth = split_user_info(url)
    return ({**identity, "base_url": clean}, True) if auth is not None else (identity, False)


def identity_differences(want: dict[str, Any], have: dict[str, Any]) -> list[str]:
    """The fields of ``want`` (this code's identity) that ``have`` (the ledger's, possibly written by older code
    with fewer fields) gives another value, each as ``field: recipe X, ledger Y``. Fields ``have`` lacks take
    :data:`IDENTITY_DEFAULTS`; fields only ``have`` has (newer code) are not compared."""
    out = []
    for key in sorted(want):
        if key in have:
            theirs = have[key]
        elif key in IDENTITY_DEFAULTS:
            theirs = IDENTITY_DEFAULTS[key](have)
        else:
            theirs = "(missing)"
        mine = want[key]
        same = (
            float(mine) == float(theirs)
            if isinstance(mine, (int, float)) and isinstance(theirs, (int, float))
            else mine == theirs
        )
        if not same:
            out.append(f"{key}: recipe {mine!r}, ledger {theirs!r}")
    return out


class Ledger(LedgerDatabase):
    """The ledger at ``url`` (file path → SQLite, ``postgresql://`` → PostgreSQL); thread-safe."""

    def __init__(self, url: str | Path, *, outage_s: float = DEFAULT_OUTAGE_S):
        super().__init__(url, outage_s=outage_s)
        migrate(self._tx, self._db)
        self._opened = True
        # the owner of runs and claims this object makes when the caller names none (an AsyncLedger names its own)
        self.owner = uuid.uuid4().hex

    # -- teacher identities
    def check_identities(self, identities: dict[str, dict[str, Any]], *, register: bool = True) -> None:
        """Each teacher name has one identity (``TeacherConfig.identity()``: base_url, model, prices) on a
        ledger: the first run that uses a name registers it (``register``), a later recipe giving the name
        another identity is refused with :class:`TeacherIdentityError` naming both, before anything is
        reserved. (Sharing the name would share its budget and, for a different model or endpoint, mislabel
        its spend.) The budget is not part of the identity: raising it is how a lifetime budget grows."""
        if not identities:
            return
        now = self._db.now

        def canonical(ident: dict[str, Any]) -> str:
            return orjson.dumps(ident, option=orjson.OPT_SORT_KEYS).decode()

        def run(c: Cursor) -> list[str]:
            names = sorted(identities)
            if register:
                for name in names:
                    c.execute(
                        f"INSERT INTO teacher_identities VALUES (?, ?, {now}) ON CONFLICT (teacher) DO NOTHING",
                        [name, canonical(identities[name])],
                    )
            rows = c.all(
                f"SELECT teacher, identity FROM teacher_identities WHERE teacher IN ({','.join('?' * len(names))})",
                names,
            )
            clashes = []
            for name, stored in rows:
                have, had_user_info = _without_user_info(orjson.loads(stored))
                want = identities[name]
                differ = identity_differences(want, have)
                if differ:
                    clashes.append(
                        f"teacher {name!r}: {'; '.join(differ)} (this recipe has {canonical(want)}, the ledger "
                        f"{self.label} already knows it as {canonical(have)})"
                    )
                elif register and (had_user_info or set(want) - set(have)):
                    # an older identity that matches (fewer fields, or a base_url that still held its user
                    # info, written before config.py took it out): stored in full and without the password now
                    c.execute(
                        "UPDATE teacher_identities SET identity = ? WHERE teacher = ?",
                        [canonical({**have, **want}), name],
                    )
            return clashes

        clashes = self._tx(run, write=register)
        if clashes:
            raise TeacherIdentityError(
                "a teacher name is reused for a different endpoint, model or price; give it a new name (a new name "
                "has its own budget and answers) or use another ledger:\n  " + "\n  ".join(clashes)
            )

    # -- runs and leases
    _RUN_COLUMNS = "run_id, host, pid, state, lease_s, started_at, heartbeat_at, closed_at, owner, machine"

    def _live(self, alias: str = "") -> str:
        """SQL: the run row (``alias.``) is live and its lease has not expired, by the database's clock."""
        return f"{alias}state = 'live' AND {self._db.beat(f'{alias}heartbeat_at')} + {alias}lease_s >= {self._db.now}"

    def start_run(self, run_id: str, lease_s: float = DEFAULT_LEASE_S, owner: str | None = None) -> None:
        """Register (or revive) a live run held by ``owner`` with a lease of ``lease_s`` seconds from now.

        A run id held by another live owner is refused (:class:`RunIdInUse`): two processes under one id would
        share its claims and each buy what the other is buying. One whose lease expired, or whose process is
        gone from this machine, is finalized first and taken over (a re-run after a crash)."""
        owner = owner or self.owner
        now = self._db.now
        machine = machine_id()

        def run(c: Cursor) -> None:
            c.execute(
                f"INSERT INTO runs ({self._RUN_COLUMNS}) VALUES (?, ?, ?, 'live', ?, {now}, {now}, NULL, ?, ?) "
                "ON CONFLICT (run_id) DO NOTHING",
                [run_id, socket.gethostname(), os.getpid(), float(lease_s), owner, machine],
            )
            holder, state, host, pid, where, age, held_s = c.one(
                f"SELECT owner, state, host, pid, machine, {now} - {self._db.beat('heartbeat_at')}, lease_s FROM runs "
                f"WHERE run_id = ?{self._db.for_update}",
                [run_id],
            )
            if holder != owner and state == "live":
                gone = bool(machine and where == machine and pid and not _pid_alive(int(pid)))
                if float(age) <= float(held_s) and not gone:
                    raise RunIdInUse(
                        f"run id {run_id!r} is live in another process ({host} pid {pid}, last heartbeat "
                        f"{max(float(age), 0):.1f}s ago, lease {float(held_s):g}s) on ledger {self.label}: two "
                        "processes under one run id would share its claims. Give this run another --run-id, or "
                        "wait until that run ends",
                        float(held_s),
                    )
                self._finalize(c, run_id, "expired", "lease expired (process gone)" if gone else "lease expired")
            c.execute(
                f"UPDATE runs SET state = 'live', lease_s = ?, heartbeat_at = {now}, pid = ?, host = ?, owner = ?, "
                "machine = ?, closed_at = NULL WHERE run_id = ?",
                [float(lease_s), os.getpid(), socket.gethostname(), owner, machine, run_id],
            )

        self._tx(run)

    def heartbeat(self, run_id: str, owner: str | None = None) -> bool:
        """Extend the lease; False when the run is no longer ``owner``'s live run (finalized after its lease
        expired, or its id taken over by another process)."""
        return bool(
            self._tx(
                lambda c: c.execute(
                    f"UPDATE runs SET heartbeat_at = {self._db.now} WHERE run_id = ? AND state = 'live' AND owner = ?",
                    [run_id, owner or self.owner],
                ).rowcount
            )
        )

    def close_run(self, run_id: str, note: str = "run ended", owner: str | None = None) -> dict[str, int]:
        """Finalize ``owner``'s run that is ending: never-sent reservations released, sent ones kept. A run id
        another process has taken over since is left to it."""
        owner = owner or self.owner

        def run(c: Cursor) -> dict[str, int]:
            row = c.one(f"SELECT owner FROM runs WHERE run_id = ?{self._db.for_update}", [run_id])
            if row and row[0] != owner:
                return {"released": 0, "kept": 0, "claims_dropped": 0}
            return self._finalize(c, run_id, "closed", note)

        return self._tx(run)

    def reconcile(self) -> dict[str, Any]:
        """Finalize every run whose lease expired, and at once every live run whose process is gone from this
        machine and PID namespace (kill -9: no need to wait out its lease); what was done, for the CLI and the
        logs. A run of another machine or namespace (same hostname or not) is judged by its lease alone."""
        machine = machine_id()
        local = (
            self._tx(
                lambda c: c.all("SELECT run_id, pid FROM runs WHERE state = 'live' AND machine = ?", [machine]),
                write=False,
            )
            if machine
            else []
        )
        dead = {rid: int(pid) for rid, pid in local if pid and not _pid_alive(int(pid))}

        def run(c: Cursor) -> dict[str, Any]:
            expired = [
                r[0]
                for r in c.all(
                    f"SELECT run_id FROM runs WHERE state = 'live' AND {self._db.beat('heartbeat_at')} + lease_s < {self._db.now} ORDER BY run_id"
                )
            ]
            # still the run seen gone (not revived since by a new process under the same id)
            gone = {
                rid
                for rid, pid in dead.items()
                if c.one(
                    "SELECT 1 FROM runs WHERE run_id = ? AND pid = ? AND machine = ? AND state = 'live'",
                    [rid, pid, machine],
                )
            }
            expired += sorted(gone - set(expired))
            # reservations of runs that never registered (a direct Ledger.try_reserve without start_run) are covered
            # by the auto-registration in try_reserve, so every open reservation has a runs row
            done = {"released": 0, "kept": 0, "claims_dropped": 0}
            for rid in expired:
                got = self._finalize(
                    c, rid, "expired", "lease expired (process gone)" if rid in gone else "lease expired"
                )
                for k in done:
                    done[k] += got[k]
            return {"expired_runs": expired, **done}

        return self._tx(run)

    def _finalize(self, c: Cursor, run_id: str, final_state: str, note: str) -> dict[str, int]:
        now = self._db.now
        c.one(f"SELECT state FROM runs WHERE run_id = ?{self._db.for_update}", [run_id])
        rows = c.all(
            "SELECT id, teacher, state, reserved_usd FROM reservations WHERE run_id = ? AND state IN ('reserved', 'sent') ORDER BY id",
            [run_id],
        )
        released = kept = 0
        moves: dict[tuple[str, str], list[float]] = {}
        for rid, teacher, state, amount in rows:
            if state == "reserved":  # never sent: certainly not billed
                c.execute(
                    f"UPDATE reservations SET state = 'released', cost_usd = 0, note = ?, closed_at = {now} WHERE id = ?",
                    [f"{note}: never sent", rid],
                )
                released += 1
                counted, kept_n = 0.0, 0
            # sent, outcome unknown: counted at its worst case
            else:
                c.execute(
                    f"UPDATE reservations SET state = 'kept', cost_usd = reserved_usd, note = ?, closed_at = {now} WHERE id = ?",
                    [f"{note}: outcome unknown, counted at worst case", rid],
                )
                kept += 1
                counted, kept_n = float(amount), 1
            for key in (("run", run_id), ("teacher", teacher)):
                m = moves.setdefault(key, [0.0, 0.0, 0])
                m[0] += float(amount)
                m[1] += counted
                m[2] += kept_n
        for scope, name in sorted(moves):
            opened, moved, moved_n = moves[(scope, name)]
            c.execute(
                "UPDATE totals SET open_usd = open_usd - ?, hard_usd = hard_usd + ?, kept_usd = kept_usd + ?, "
                "kept_calls = kept_calls + ? WHERE scope = ? AND key = ?",
                [opened, moved, moved, moved_n, scope, name],
            )
        dropped = c.execute("DELETE FROM claims WHERE run_id = ? AND state = 'inflight'", [run_id]).rowcount
        c.execute("DELETE FROM waiters WHERE run_id = ?", [run_id])
        c.execute(
            f"UPDATE runs SET state = ?, closed_at = {now} WHERE run_id = ? AND state = 'live'", [final_state, run_id]
        )
        return {"released": released, "kept": kept, "claims_dropped": max(dropped, 0)}

    # -- claims
    def claim(self, call_id: str, teacher: str, run_id: str, owner: str | None = None) -> Claim:
        """Claim the purchase of ``call_id`` for ``owner``'s run ``run_id``: mine, already answered (with the
        answer), wait (another live run holds it) or batched (a live provider batch holds it)."""
        now = self._db.now
        owner = owner or self.owner

        def run(c: Cursor) -> Claim:
            held = c.one("SELECT batch_id FROM batch_calls WHERE call_id = ? AND state = 'pending'", [call_id])
            # a live provider batch holds it (ledger/batches.py): its answer comes from the batch
            if held:
                return Claim("batched", owner=f"batch:{held[0]}")
            ins = c.execute(
                "INSERT INTO claims (call_id, teacher, run_id, state, record, reason, cost_usd, created_at, updated_at, "
                f"owner) VALUES (?, ?, ?, 'inflight', NULL, NULL, NULL, {now}, {now}, ?) ON CONFLICT (call_id) DO NOTHING",
                [call_id, teacher, run_id, owner],
            )
            if ins.rowcount == 1:
                return Claim("mine")
            state, holder, holder_owner, record = c.one(
                f"SELECT state, run_id, owner, record FROM claims WHERE call_id = ?{self._db.for_update}", [call_id]
            )
            if state == "answered":
                return Claim("answered", orjson.loads(record))
            if state == "inflight" and (holder, holder_owner) != (run_id, owner):
                live = c.one(
                    f"SELECT 1 FROM runs WHERE run_id = ? AND owner = ? AND {self._live()}", [holder, holder_owner]
                )
                if live:
                    return Claim("wait", owner=holder)
            c.execute(
                f"UPDATE claims SET run_id = ?, owner = ?, state = 'inflight', reason = NULL, updated_at = {now} "
                "WHERE call_id = ?",
                [run_id, owner, call_id],
            )
            return Claim("mine")

        return self._tx(run)

    def claims_status(self, call_ids: list[str]) -> dict[str, str]:
        """call_id → answered | failed | inflight | orphaned (claimant's lease expired) | free (no claim)."""
        if not call_ids:
            return {}
        out = {cid: "free" for cid in call_ids}

        def run(c: Cursor) -> None:
            for i in range(0, len(call_ids), 500):
                chunk = call_ids[i : i + 500]
                q = (
                    f"SELECT c.call_id, c.state, CASE WHEN {self._live('r.')} THEN 1 ELSE 0 END FROM claims c "
                    f"LEFT JOIN runs r ON r.run_id = c.run_id AND r.owner = c.owner WHERE c.call_id IN ({','.join('?' * len(chunk))})"
                )
                for cid, state, live in c.all(q, chunk):
                    out[cid] = "orphaned" if state == "inflight" and not live else state

        self._tx(run, write=False)
        return out

    def fail_claim(self, call_id: str, run_id: str, reason: str, owner: str | None = None) -> None:
        """The claimant gave up without an answer: the next run that needs it may buy it."""
        self._tx(
            lambda c: c.execute(
                f"UPDATE claims SET state = 'failed', reason = ?, updated_at = {self._db.now} "
                "WHERE call_id = ? AND run_id = ? AND owner = ? AND state = 'inflight'",
                [reason[:300], call_id, run_id, owner or self.owner],
            )
        )

    def answer(self, call_id: str) -> dict[str, Any] | None:
        """The paid answer stored with its claim (the response-cache record), if any."""
        row = self._tx(
            lambda c: c.one("SELECT record FROM claims WHERE call_id = ? AND state = 'answered'", [call_id]),
            write=False,
        )
        return orjson.loads(row[0]) if row else None

    def answered_ids(self, call_ids: list[str]) -> set[str]:
        st = self.claims_status(call_ids)
        return {k for k, v in st.items() if v == "answered"}

    # -- reservations
    def try_reserve(self, op: Reserve, waiter_id: str | None = None) -> Reservation:
        """One attempt: granted, refused (no room even if every call in flight settles at 0), or wait."""
        now = self._db.now
        waiter_id = waiter_id or uuid.uuid4().hex
        amount = float(op.amount_usd)

        def run(c: Cursor) -> Reservation:
            c.execute(
                f"INSERT INTO runs ({self._RUN_COLUMNS}) VALUES (?, ?, ?, 'live', ?, {now}, {now}, NULL, ?, ?) "
                "ON CONFLICT (run_id) DO NOTHING",
                [op.run_id, socket.gethostname(), os.getpid(), DEFAULT_LEASE_S, op.owner or self.owner, machine_id()],
            )
            if op.owner and not self._holds(c, op.run_id, op.owner, op.call_id):
                c.execute("DELETE FROM waiters WHERE id = ?", [waiter_id])
                return Reservation(False, "", f"claim lost: run {op.run_id} no longer holds {op.call_id}", lost=True)
            for scope, key in (("run", op.run_id), ("teacher", op.teacher)):
                c.execute(
                    "INSERT INTO totals (scope, key) VALUES (?, ?) ON CONFLICT (scope, key) DO NOTHING", [scope, key]
                )
            r_hard, r_open = c.one(
                f"SELECT hard_usd, open_usd FROM totals WHERE scope = 'run' AND key = ?{self._db.for_update}",
                [op.run_id],
            )
            t_hard, t_open = c.one(
                f"SELECT hard_usd, open_usd FROM totals WHERE scope = 'teacher' AND key = ?{self._db.for_update}",
                [op.teacher],
            )
            t_room, r_room = op.budget_usd - t_hard, op.ceiling_usd - r_hard
            refusal = ""
            if amount > t_room + EPS:
                refusal = (
                    f"teacher budget: worst case ${amount:.6f} > remaining ${max(t_room, 0):.6f} of ${op.budget_usd:g}"
                )
            elif amount > r_room + EPS:
                refusal = (
                    f"run ceiling: worst case ${amount:.6f} > remaining ${max(r_room, 0):.6f} of ${op.ceiling_usd:g}"
                )
            mine = c.one("SELECT created_at FROM waiters WHERE id = ?", [waiter_id])
            if refusal:
                if mine:
                    c.execute("DELETE FROM waiters WHERE id = ?", [waiter_id])
                return Reservation(False, "", refusal)
            # fair share: waiters of this teacher are served first, the run holding the least money in flight
            # first, then in order of arrival; a newcomer queues behind the waiters of its rank. Ranked in Python
            # with one key function, so every waiter sees the same total order (no cycles, no deadlock).
            waiting = c.all(
                "SELECT w.id, w.created_at, w.amount_usd, COALESCE(t.open_usd, 0) FROM waiters w "
                "LEFT JOIN totals t ON t.scope = 'run' AND t.key = w.run_id WHERE w.teacher = ?",
                [op.teacher],
            )
            me = (round(float(r_open), 9), mine[0] if mine else float("inf"), waiter_id)
            ahead = sum(
                float(amt)
                for wid, created, amt, held in waiting
                if wid != waiter_id and (round(float(held), 9), created, wid) < me
            )
            t_free, r_free = t_room - t_open - float(ahead), r_room - r_open
            if amount <= t_free + EPS and amount <= r_free + EPS:
                rid = uuid.uuid4().hex
                c.execute(
                    f"INSERT INTO reservations VALUES (?, ?, ?, ?, 'reserved', ?, NULL, NULL, {now}, NULL)",
                    [rid, op.teacher, op.run_id, op.call_id or None, amount],
                )
                for scope, key in (("run", op.run_id), ("teacher", op.teacher)):
                    c.execute(
                        "UPDATE totals SET open_usd = open_usd + ? WHERE scope = ? AND key = ?", [amount, scope, key]
                    )
                if mine:
                    c.execute("DELETE FROM waiters WHERE id = ?", [waiter_id])
                return Reservation(True, rid)
            if not mine:
                c.execute(f"INSERT INTO waiters VALUES (?, ?, ?, ?, {now})", [waiter_id, op.teacher, op.run_id, amount])
            what = "teacher budget" if amount > t_free + EPS else "run ceiling"
            return Reservation(False, "", f"{what}: waiting for calls in flight to settle", wait=True)

        return self._tx(run)

    def _holds(self, c: Cursor, run_id: str, owner: str, call_id: str | None) -> bool:
        """``owner`` holds the live run ``run_id`` (lease not expired) and, when given, the claim on ``call_id``."""
        if not c.one(f"SELECT 1 FROM runs WHERE run_id = ? AND owner = ? AND {self._live()}", [run_id, owner]):
            return False
        return not call_id or bool(
            c.one(
                "SELECT 1 FROM claims WHERE call_id = ? AND run_id = ? AND owner = ? AND state = 'inflight'",
                [call_id, run_id, owner],
            )
        )

    def mark_sent(self, reservation_id: str, owner: str | None = None) -> bool:
        """The request is about to leave: from now on an unknown outcome is kept, not released. With ``owner``
        (a replay run) only while that run still holds its lease and the request's claim; False when it does
        not (a run paused past its lease: another run may be buying it), and the request must not be sent."""

        def run(c: Cursor) -> bool:
            if owner:
                row = c.one(
                    "SELECT run_id, call_id FROM reservations WHERE id = ? AND state = 'reserved'", [reservation_id]
                )
                if not row or not self._holds(c, row[0], owner, row[1]):
                    return False
            return (
                c.execute(
                    "UPDATE reservations SET state = 'sent' WHERE id = ? AND state = 'reserved'", [reservation_id]
                ).rowcount
                == 1
            )

        return bool(self._tx(run))

    def close(
        self,
        reservation_id: str,
        state: str,
        cost_usd: float | None = None,
        note: str = "",
        answer: tuple[str, dict[str, Any]] | None = None,
        usage: dict[str, Any] | None = None,
    ) -> bool:
        """Settle / keep / release one reservation; with ``answer=(call_id, record)`` the answer is stored in
        its claim in the same transaction (unless the claim already holds an answer). ``usage`` (a settle's
        :class:`~composer_pipeline.teachers.pricing.Billed` as a dict) is recorded in ``billed_usage`` in the
        same transaction.

        A settle of a reservation already finalized (kept at its worst case, or released, by a reconcile while
        its run was paused past its lease or cut off from the ledger) still counts: the provider billed it, so
        it is settled at its actual cost. Any other close of a closed reservation changes nothing (False)."""
        if state not in ("settled", "kept", "released"):
            raise ValueError(f"unknown reservation state {state!r}")
        now = self._db.now

        def run(c: Cursor) -> bool:
            row = c.one(
                f"SELECT teacher, run_id, state, reserved_usd, cost_usd, note FROM reservations WHERE id = ?{self._db.for_update}",
                [reservation_id],
            )
            done = False
            if row and state == "settled" and row[2] in ("kept", "released"):
                teacher, run_id, was, _, before, was_note = row
                counted, before = float(cost_usd or 0.0), float(before or 0.0)
                late = f"settled late (was {was}: {was_note or ''})"
                c.execute(
                    f"UPDATE reservations SET state = 'settled', cost_usd = ?, note = ?, closed_at = {now} WHERE id = ?",
                    [counted, (f"{note}; {late}" if note else late)[:300], reservation_id],
                )
                kept_before = before if was == "kept" else 0.0
                for scope, key in (("run", run_id), ("teacher", teacher)):
                    c.execute(
                        "UPDATE totals SET hard_usd = hard_usd + ?, settled_usd = settled_usd + ?, kept_usd = kept_usd - ?, "
                        "kept_calls = kept_calls - ? WHERE scope = ? AND key = ?",
                        [counted - before, counted, kept_before, 1 if was == "kept" else 0, scope, key],
                    )
                done = True
            elif row and row[2] in OPEN_STATES:
                teacher, run_id, _, amount, *_ = row
                counted = {"settled": float(cost_usd or 0.0), "kept": float(amount), "released": 0.0}[state]
                c.execute(
                    f"UPDATE reservations SET state = ?, cost_usd = ?, note = ?, closed_at = {now} WHERE id = ?",
                    [state, counted, note[:300] or None, reservation_id],
                )
                s_add = counted if state == "settled" else 0.0
                k_add = counted if state == "kept" else 0.0
                for scope, key in (("run", run_id), ("teacher", teacher)):
                    c.execute(
                        "UPDATE totals SET open_usd = open_usd - ?, hard_usd = hard_usd + ?, settled_usd = settled_usd + ?, "
                        "kept_usd = kept_usd + ?, kept_calls = kept_calls + ? WHERE scope = ? AND key = ?",
                        [float(amount), counted, s_add, k_add, 1 if state == "kept" else 0, scope, key],
                    )
                done = True
            if done and usage is not None and state == "settled":
                c.execute(
                    f"INSERT INTO billed_usage (reservation_id, teacher, run_id, call_id, prompt_tokens, completion_tokens, "
                    f"cached_tokens, cache_write_tokens, billed_usd, full_price_usd, created_at) "
                    f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {now})",
                    [
                        reservation_id,
                        teacher,
                        run_id,
                        answer[0] if answer else None,
                        int(usage["prompt_tokens"]),
                        int(usage["completion_tokens"]),
                        int(usage["cached_tokens"]),
                        int(usage["cache_write_tokens"]),
                        counted,
                        float(usage["full_price_usd"]),
                    ],
                )
            if answer is not None:
                cid, record = answer
                teacher_name = record.get("teacher") or (row[0] if row else "")
                c.execute(
                    "INSERT INTO claims (call_id, teacher, run_id, state, record, reason, cost_usd, created_at, updated_at, "
                    f"owner) VALUES (?, ?, ?, 'answered', ?, NULL, ?, {now}, {now}, '') ON CONFLICT (call_id) DO UPDATE SET "
                    f"state = 'answered', record = excluded.record, cost_usd = excluded.cost_usd, reason = NULL, updated_at = {now} "
                    "WHERE claims.state <> 'answered'",
                    [
                        cid,
                        teacher_name,
                        record.get("run_id") or (row[1] if row else ""),
                        orjson.dumps(record).decode(),
                        record.get("cost_usd"),
                    ],
                )
            return done

        return self._tx(run)

    # -- reads (plain transactions: on SQLite/WAL they never block a writer)
    def _totals(self, scope: str, key: str) -> tuple[float, float, float, float, int]:
        row = self._tx(
            lambda c: c.one(
                "SELECT hard_usd, open_usd, settled_usd, kept_usd, kept_calls FROM totals WHERE scope = ? AND key = ?",
                [scope, key],
            ),
            write=False,
        )
        if not row:
            return (0.0, 0.0, 0.0, 0.0, 0)
        # running sums of floats: drop the 1e-18 residue of adding and removing the same amounts
        hard, opened, settled, kept = (round(float(v), 12) for v in row[:4])
        return hard, opened, settled, kept, int(row[4])

    def spent(self, teacher: str) -> float:
        """Everything this teacher has cost or may have cost (settled + kept + in flight)."""
        hard, open_, *_ = self._totals("teacher", teacher)
        return max(0.0, float(hard) + float(open_))

    def room(self, teacher: str, budget: float) -> float:
        """What may still be spent once the calls in flight settle (budget − settled − kept): what a plan can
        count on, since a reservation waits for money in flight instead of failing."""
        hard, *_ = self._totals("teacher", teacher)
        return max(0.0, budget - float(hard))

    def balance(self, teacher: str, budget_usd: float) -> Balance:
        hard, open_, settled, kept, kept_calls = self._totals("teacher", teacher)
        open_ = max(0.0, float(open_))
        spent = float(hard) + open_
        return Balance(
            teacher,
            float(budget_usd),
            spent,
            float(settled),
            float(kept),
            open_,
            max(0.0, budget_usd - spent),
            int(kept_calls),
        )

    def open_reservations(self) -> int:
        return int(
            self._tx(
                lambda c: c.one("SELECT COUNT(*) FROM reservations WHERE state IN ('reserved', 'sent')")[0], write=False
            )
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def open_ledger(url: str | Path | None = None) -> Ledger:
    """The ledger at ``url``, else the default one (:func:`composer_pipeline.home.default_ledger_url`)."""
    return Ledger(url or home.default_ledger_url())
