"""Provider batches in the ledger (schema 5): what a batch holds, recorded before it is sent.

In:  a :class:`~composer_pipeline.ledger.Ledger`, and from ``replay/batch.py`` one teacher's calls
     (call id, worst case at batch prices, the bounds ``pricing.settle`` clamps to), its budget, the run ceiling.
Out: rows of ``batches`` and ``batch_calls``, and one reservation per call in state ``batched``.

Money rules (beside those of ``core.py``):

* :func:`record_batch` reserves every call's worst case at batch prices and records the batch and its calls
  in ONE transaction, before the POST: a process killed at any later point leaves the money held and the
  calls known. A call already pending in a live batch is not recorded again (``batch_calls`` is keyed by
  call id): no process submits it twice. The budget is a ceiling here: a call that does not fit
  ``budget − settled − kept − held`` (or the run ceiling) is refused, never queued (a batch holds its money
  for up to 24 h).
* A batch reservation belongs to the batch (``run_id = batch:<id>``), not to the run that recorded it: a run
  that ends, dies or expires leaves it held (``core._finalize`` finalizes ``reserved`` / ``sent`` only).
* Each call is settled once, through :meth:`Ledger.close` (a second settle of a closed reservation changes
  nothing) at the billed usage clamped by ``pricing.settle``; an expired, canceled or errored call is
  released (not billed) and may go out again alone.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from composer_pipeline.ledger.core import EPS, Ledger

LIVE_STATES = ("recorded", "submitted")


@dataclass(frozen=True)
class BatchCall:
    call_id: str
    worst_usd: float
    prompt_bound: int
    completion_bound: int


@dataclass(frozen=True)
class BatchRow:
    id: str
    teacher: str
    api: str
    run_id: str
    state: str
    provider_id: str | None
    n_requests: int
    reserved_usd: float
    created_at: float


@dataclass(frozen=True)
class PendingCall:
    call_id: str
    reservation_id: str
    reserved_usd: float
    prompt_bound: int
    completion_bound: int
    submissions: int


@dataclass
class Recorded:
    # None: nothing recorded (every call held elsewhere or refused)
    batch_id: str | None
    granted: list[str]
    held: list[str]  # pending in another live batch already
    refused: dict[str, str]  # call id -> why (budget / ceiling)


def record_batch(
    ledger: Ledger,
    teacher: str,
    api: str,
    run_id: str,
    calls: list[BatchCall],
    *,
    budget_usd: float,
    ceiling_usd: float,
) -> Recorded:
    """Record one batch of ``teacher``'s ``calls`` with their reservations (see the module docstring)."""
    now = ledger._db.now
    bid = uuid.uuid4().hex
    pseudo = f"batch:{bid}"

    def run(c) -> Recorded:
        out = Recorded(bid, [], [], {})
        c.execute(
            "INSERT INTO totals (scope, key) VALUES ('teacher', ?) ON CONFLICT (scope, key) DO NOTHING", [teacher]
        )
        c.execute("INSERT INTO totals (scope, key) VALUES ('run', ?) ON CONFLICT (scope, key) DO NOTHING", [pseudo])
        hard, open_ = c.one(
            f"SELECT hard_usd, open_usd FROM totals WHERE scope = 'teacher' AND key = ?{ledger._db.for_update}",
            [teacher],
        )
        room = budget_usd - float(hard) - float(open_)
        # the run ceiling: what this run's live batches hold plus this one
        held_by_run = float(
            c.one(
                "SELECT COALESCE(SUM(r.reserved_usd), 0) FROM reservations r JOIN batches b ON r.run_id = "
                "'batch:' || b.id WHERE b.run_id = ? AND r.state = 'batched'",
                [run_id],
            )[0]
        )
        ceiling_room = ceiling_usd - held_by_run
        c.execute(
            f"INSERT INTO batches VALUES (?, ?, ?, ?, 'recorded', NULL, 0, 0, NULL, {now}, {now})",
            [bid, teacher, api, run_id],
        )
        total = 0.0
        for call in calls:
            amount = float(call.worst_usd)
            if amount > room + EPS:
                out.refused[call.call_id] = (
                    f"budget_exhausted: teacher budget: batch worst case ${amount:.6f} > remaining ${max(room, 0):.6f} "
                    f"of ${budget_usd:g}"
                )
                continue
            if amount > ceiling_room + EPS:
                out.refused[call.call_id] = (
                    f"budget_exhausted: run ceiling: batch worst case ${amount:.6f} > remaining "
                    f"${max(ceiling_room, 0):.6f} of ${ceiling_usd:g}"
                )
                continue
            rid = uuid.uuid4().hex
            took = c.execute(
                "INSERT INTO batch_calls VALUES (?, ?, ?, ?, 'pending', ?, ?, 1, NULL, "
                f"{now}) ON CONFLICT (call_id) DO UPDATE SET batch_id = excluded.batch_id, reservation_id = "
                "excluded.reservation_id, state = 'pending', prompt_bound = excluded.prompt_bound, completion_bound = "
                "excluded.completion_bound, submissions = batch_calls.submissions + 1, note = NULL, updated_at = "
                "excluded.updated_at WHERE batch_calls.state = 'released'",
                [call.call_id, bid, teacher, rid, int(call.prompt_bound), int(call.completion_bound)],
            ).rowcount
            if took != 1:
                out.held.append(call.call_id)
                continue
            c.execute(
                f"INSERT INTO reservations VALUES (?, ?, ?, ?, 'batched', ?, NULL, NULL, {now}, NULL)",
                [rid, teacher, pseudo, call.call_id, amount],
            )
            room -= amount
            ceiling_room -= amount
            total += amount
            out.granted.append(call.call_id)
        if not out.granted:
            c.execute("DELETE FROM batches WHERE id = ?", [bid])
            out.batch_id = None
            return out
        for scope, key in (("teacher", teacher), ("run", pseudo)):
            c.execute("UPDATE totals SET open_usd = open_usd + ? WHERE scope = ? AND key = ?", [total, scope, key])
        c.execute("UPDATE batches SET n_requests = ?, reserved_usd = ? WHERE id = ?", [len(out.granted), total, bid])
        return out

    # a settled or answered call is never recorded: a settled batch_call is not 'released'
    return ledger._tx(run)


def set_submitted(ledger: Ledger, batch_id: str, provider_id: str, note: str = "") -> None:
    """The provider answered the POST (or the batch was found again): its id, right after."""
    ledger._tx(
        lambda c: c.execute(
            f"UPDATE batches SET state = 'submitted', provider_id = ?, note = ?, updated_at = {ledger._db.now} "
            "WHERE id = ? AND state IN ('recorded', 'submitted')",
            [provider_id, note[:300] or None, batch_id],
        )
    )


def set_requests(ledger: Ledger, batch_id: str, n: int) -> None:
    """The batch goes out again with ``n`` of its calls (the others released)."""
    ledger._tx(lambda c: c.execute("UPDATE batches SET n_requests = ? WHERE id = ?", [int(n), batch_id]))


def set_collected(ledger: Ledger, batch_id: str, note: str = "") -> None:
    ledger._tx(
        lambda c: c.execute(
            f"UPDATE batches SET state = 'collected', note = ?, updated_at = {ledger._db.now} WHERE id = ?",
            [note[:300] or None, batch_id],
        )
    )


def live_batches(ledger: Ledger, teachers: list[str]) -> list[BatchRow]:
    """The batches of ``teachers`` not collected yet (recorded or submitted), oldest first."""
    if not teachers:
        return []
    rows = ledger._tx(
        lambda c: c.all(
            "SELECT id, teacher, api, run_id, state, provider_id, n_requests, reserved_usd, created_at FROM batches "
            f"WHERE state IN ('recorded', 'submitted') AND teacher IN ({','.join('?' * len(teachers))}) "
            "ORDER BY created_at, id",
            list(teachers),
        ),
        write=False,
    )
    return [BatchRow(r[0], r[1], r[2], r[3], r[4], r[5], int(r[6]), float(r[7]), float(r[8])) for r in rows]


def batches_since(ledger: Ledger, since: float) -> list[BatchRow]:
    """Every batch (live or collected) recorded at or after ``since`` (epoch seconds), oldest first: what
    the Dagster ``batch_collect_sensor`` maps to partitions (a batch's ``run_id`` is the run that recorded it)."""
    rows = ledger._tx(
        lambda c: c.all(
            "SELECT id, teacher, api, run_id, state, provider_id, n_requests, reserved_usd, created_at FROM batches "
            "WHERE created_at >= ? ORDER BY created_at, id",
            [float(since)],
        ),
        write=False,
    )
    return [BatchRow(r[0], r[1], r[2], r[3], r[4], r[5], int(r[6]), float(r[7]), float(r[8])) for r in rows]


def known_provider_ids(ledger: Ledger) -> set[str]:
    rows = ledger._tx(lambda c: c.all("SELECT provider_id FROM batches WHERE provider_id IS NOT NULL"), write=False)
    return {r[0] for r in rows}


def pending_calls(ledger: Ledger, batch_id: str) -> dict[str, PendingCall]:
    """The calls of ``batch_id`` still waiting for their result."""
    rows = ledger._tx(
        lambda c: c.all(
            "SELECT b.call_id, b.reservation_id, r.reserved_usd, b.prompt_bound, b.completion_bound, b.submissions "
            "FROM batch_calls b JOIN reservations r ON r.id = b.reservation_id "
            "WHERE b.batch_id = ? AND b.state = 'pending'",
            [batch_id],
        ),
        write=False,
    )
    return {r[0]: PendingCall(r[0], r[1], float(r[2]), int(r[3]), int(r[4]), int(r[5])) for r in rows}


def call_states(ledger: Ledger, call_ids: list[str]) -> dict[str, tuple[str, str, int, str | None]]:
    """call id -> (state, batch id, submissions, note) for the calls that ever went out in a batch."""
    out: dict[str, tuple[str, str, int, str | None]] = {}

    def run(c) -> None:
        for i in range(0, len(call_ids), 500):
            chunk = call_ids[i : i + 500]
            q = (
                "SELECT call_id, state, batch_id, submissions, note FROM batch_calls "
                f"WHERE call_id IN ({','.join('?' * len(chunk))})"
            )
            for cid, state, bid, n, note in c.all(q, chunk):
                out[cid] = (state, bid, int(n), note)

    if call_ids:
        ledger._tx(run, write=False)
    return out


def finish_call(
    ledger: Ledger,
    call: PendingCall,
    state: str,
    *,
    cost_usd: float | None = None,
    note: str = "",
    answer: tuple[str, dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    run_id: str | None = None,
) -> bool:
    """Settle (``settled``), keep or release (``released``) one call of a batch: its reservation closed through
    :meth:`Ledger.close` (once: a closed reservation changes nothing again), then the call marked, and its
    ``billed_usage`` row credited to ``run_id`` (the run that collected it: what its summary reports). True
    when this call's reservation was closed now."""
    closed = ledger.close(call.reservation_id, state, cost_usd=cost_usd, note=note, answer=answer, usage=usage)

    def run(c) -> None:
        c.execute(
            f"UPDATE batch_calls SET state = ?, note = ?, updated_at = {ledger._db.now} "
            "WHERE call_id = ? AND reservation_id = ? AND state = 'pending'",
            [state, note[:300] or None, call.call_id, call.reservation_id],
        )
        if closed and run_id:
            c.execute("UPDATE billed_usage SET run_id = ? WHERE reservation_id = ?", [run_id, call.reservation_id])

    ledger._tx(run)
    return closed


def held_by_batches(ledger: Ledger, teacher: str) -> tuple[float, int, int]:
    """(USD held by live batches, live batches, calls pending in them) of ``teacher``."""
    row = ledger._tx(
        lambda c: c.one(
            "SELECT COALESCE(SUM(r.reserved_usd), 0), COUNT(DISTINCT b.batch_id), COUNT(*) FROM batch_calls b "
            "JOIN reservations r ON r.id = b.reservation_id WHERE b.teacher = ? AND b.state = 'pending' "
            "AND r.state = 'batched'",
            [teacher],
        ),
        write=False,
    )
    return float(row[0]), int(row[1]), int(row[2])


def batch_holds(ledger: Ledger, teachers: list[str], call_ids: list[str]) -> tuple[set[str], dict[str, float]]:
    """For a cost plan: which of ``call_ids`` are pending in a live batch (already reserved), and the USD live
    batches hold per teacher (all their calls: money that is not room while they run)."""
    held = {t: held_by_batches(ledger, t)[0] for t in teachers}
    if not any(held.values()):
        return set(), held
    pending = {
        cid for cid, (state, *_rest) in call_states(ledger, [c for c in call_ids if c]).items() if state == "pending"
    }
    return pending, held


def recorded_by_live_run(ledger: Ledger, batch_id: str, owner: str) -> bool:
    """The run that recorded ``batch_id`` is live in another process (its lease held, its process not seen
    gone): its POST may be on the wire now, so nobody else may look for or resubmit the batch yet."""
    # a dead process's run (same machine: at once; elsewhere: once its lease expired) ends here
    ledger.reconcile()
    row = ledger._tx(
        lambda c: c.one(
            f"SELECT 1 FROM batches b JOIN runs r ON r.run_id = b.run_id WHERE b.id = ? AND r.owner <> ? AND "
            f"{ledger._live('r.')}",
            [batch_id, owner],
        ),
        write=False,
    )
    return bool(row)
