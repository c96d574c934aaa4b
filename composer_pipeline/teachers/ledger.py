"""Budget ledger: reservations against teacher budgets and run ceilings, in a DuckDB file.

In:  reserve / settle / keep / release operations from replay runs (any number of processes).
Out: a durable ``reservations`` table; ``spent(teacher)``, ``remaining(teacher, budget)``,
     ``spend_by_run(run_id)``.

Money rules (the replay client follows them):

* before sending, *reserve* the worst-case cost; the reservation is refused (nothing is sent) when
  ``spent(teacher) + amount > budget`` or ``spent(run) + amount > ceiling``;
* after a response with usage, *settle* at the actual cost;
* when the outcome is unknown (dropped connection after send, truncated body, timeout), *keep* the
  reservation: it counts as spent at the worst case forever;
* when the request certainly was not billed (connection refused, 429/5xx error response), *release*.

A reservation left ``reserved`` by a killed process also counts as spent at its worst case.

Concurrency: every transaction runs inside one exclusive ``flock`` on ``<path>.lock``; the DuckDB
connection is opened and closed inside the lock because DuckDB admits one writer process per file.
Checks and writes happen under the same lock, so concurrent reservations (threads, tasks or
processes) can never overdraw a budget. Opening DuckDB costs 25–200 ms on a busy machine, so a replay
run goes through :class:`AsyncLedger`, which takes budget as per-run *credit* in few transactions and
writes call closes in background batches (see its docstring for why that stays safe).

Rows: a call's own reservation (``reserve``/``settle``/...), a run's credit row (``note = 'credit'``), or
a call closed against a credit (written directly as settled/kept/released).
"""

from __future__ import annotations

import asyncio
import fcntl
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from composer_pipeline.home import default_home  # noqa: F401  (where callers found it before home.py)

EPS = 1e-12  # float slack when comparing sums of dollars
FLUSH_DELAY_S = 0.25  # AsyncLedger: how long closes may wait to be written together

_DDL = """
CREATE TABLE IF NOT EXISTS reservations (
    id VARCHAR PRIMARY KEY,
    teacher VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    call_id VARCHAR,
    state VARCHAR NOT NULL,          -- reserved | settled | kept | released
    reserved_usd DOUBLE NOT NULL,
    cost_usd DOUBLE,                 -- actual (settled); = reserved_usd when kept; 0 when released
    note VARCHAR,
    created_at TIMESTAMP NOT NULL,
    closed_at TIMESTAMP
)
"""
# what a reservation counts as, by state
_SPENT_EXPR = "SUM(CASE state WHEN 'settled' THEN cost_usd WHEN 'released' THEN 0 ELSE reserved_usd END)"


@dataclass
class Reserve:
    teacher: str
    budget_usd: float
    run_id: str
    ceiling_usd: float
    amount_usd: float
    call_id: str = ""
    id: str = ""
    chunk_usd: float = 0.0  # AsyncLedger: credit to ask for at once (≈ max_concurrency worst cases)


@dataclass
class Close:
    id: str
    state: str  # settled | kept | released
    cost_usd: float | None = None  # for settled
    note: str = ""


@dataclass(frozen=True)
class Reservation:
    ok: bool
    id: str
    reason: str = ""  # why it was refused


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Ledger:
    """A DuckDB budget ledger shared by every run and process that points at ``path``."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._thread_lock = threading.Lock()
        self._with_conn(lambda con: None)  # create the table; fail early on a bad path

    # -- plumbing
    def _with_conn(self, fn):
        import duckdb

        with self._thread_lock, open(self.lock_path, "a+") as lockf:
            fcntl.flock(lockf.fileno(), fcntl.LOCK_EX)
            try:
                con = duckdb.connect(str(self.path), config={"threads": 1})
                try:
                    con.execute(_DDL)
                    con.execute("BEGIN TRANSACTION")
                    try:
                        out = fn(con)
                        con.execute("COMMIT")
                    except BaseException:
                        con.execute("ROLLBACK")
                        raise
                    return out
                finally:
                    con.close()
            finally:
                fcntl.flock(lockf.fileno(), fcntl.LOCK_UN)

    # -- writes
    def apply(self, ops: list[Reserve | Close]) -> list[Reservation | None]:
        """Apply operations in order inside one locked transaction; a result per op."""

        def run(con) -> list[Reservation | None]:
            teachers = sorted({o.teacher for o in ops if isinstance(o, Reserve)})
            runs = sorted({o.run_id for o in ops if isinstance(o, Reserve)})
            t_spent = {t: 0.0 for t in teachers}
            r_spent = {r: 0.0 for r in runs}
            if teachers:
                q = f"SELECT teacher, {_SPENT_EXPR} FROM reservations WHERE teacher IN ({','.join('?' * len(teachers))}) GROUP BY teacher"
                t_spent.update({t: float(s or 0) for t, s in con.execute(q, teachers).fetchall()})
                q = f"SELECT run_id, {_SPENT_EXPR} FROM reservations WHERE run_id IN ({','.join('?' * len(runs))}) GROUP BY run_id"
                r_spent.update({r: float(s or 0) for r, s in con.execute(q, runs).fetchall()})
            inserts: list[tuple[Any, ...]] = []
            updates: list[tuple[Any, ...]] = []
            results: list[Reservation | None] = []
            now = _now()
            for o in ops:
                if isinstance(o, Reserve):
                    rid = o.id or uuid.uuid4().hex
                    t_left = o.budget_usd - t_spent[o.teacher]
                    r_left = o.ceiling_usd - r_spent[o.run_id]
                    if o.amount_usd > t_left + EPS:
                        results.append(Reservation(False, rid, f"teacher budget: worst case ${o.amount_usd:.6f} > remaining ${max(t_left, 0):.6f} of ${o.budget_usd:g}"))
                    elif o.amount_usd > r_left + EPS:
                        results.append(Reservation(False, rid, f"run ceiling: worst case ${o.amount_usd:.6f} > remaining ${max(r_left, 0):.6f} of ${o.ceiling_usd:g}"))
                    else:
                        t_spent[o.teacher] += o.amount_usd
                        r_spent[o.run_id] += o.amount_usd
                        inserts.append((rid, o.teacher, o.run_id, o.call_id, "reserved", o.amount_usd, None, None, now, None))
                        results.append(Reservation(True, rid))
                else:
                    if o.state not in ("settled", "kept", "released"):
                        raise ValueError(f"unknown reservation state {o.state!r}")
                    updates.append((o.state, o.cost_usd, o.note or None, now, o.id))
                    results.append(None)
            if inserts:
                con.executemany("INSERT INTO reservations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", inserts)
            for state, cost, note, at, rid in updates:
                cost_sql = {"settled": "?", "kept": "reserved_usd", "released": "0"}[state]
                params = [state, *([cost] if state == "settled" else []), note, at, rid]
                con.execute(
                    f"UPDATE reservations SET state = ?, cost_usd = {cost_sql}, note = ?, closed_at = ? "
                    "WHERE id = ? AND state = 'reserved'",
                    params,
                )
            return results

        return self._with_conn(run) if ops else []

    def reserve(self, teacher: str, amount_usd: float, *, budget_usd: float, run_id: str, ceiling_usd: float, call_id: str = "") -> Reservation:
        return self.apply([Reserve(teacher, budget_usd, run_id, ceiling_usd, amount_usd, call_id)])[0]  # type: ignore[return-value]

    def settle(self, reservation_id: str, cost_usd: float) -> None:
        self.apply([Close(reservation_id, "settled", cost_usd)])

    def keep(self, reservation_id: str, note: str = "") -> None:
        self.apply([Close(reservation_id, "kept", note=note)])

    def release(self, reservation_id: str, note: str = "") -> None:
        self.apply([Close(reservation_id, "released", note=note)])

    # -- credit (used by AsyncLedger)
    def grant(self, credit_id: str, teacher: str, budget_usd: float, run_id: str, ceiling_usd: float,
              need: float, want: float) -> tuple[float, str]:
        """Add between ``need`` and ``want`` USD to a run's credit row, as much as the teacher budget and
        the run ceiling allow; (0, reason) when not even ``need`` fits."""

        def run(con) -> tuple[float, str]:
            t_spent = float(con.execute(f"SELECT COALESCE({_SPENT_EXPR}, 0) FROM reservations WHERE teacher = ?", [teacher]).fetchone()[0])
            r_spent = float(con.execute(f"SELECT COALESCE({_SPENT_EXPR}, 0) FROM reservations WHERE run_id = ?", [run_id]).fetchone()[0])
            t_left, r_left = budget_usd - t_spent, ceiling_usd - r_spent
            if need > t_left + EPS:
                return 0.0, f"teacher budget: worst case ${need:.6f} > remaining ${max(t_left, 0):.6f} of ${budget_usd:g}"
            if need > r_left + EPS:
                return 0.0, f"run ceiling: worst case ${need:.6f} > remaining ${max(r_left, 0):.6f} of ${ceiling_usd:g}"
            g = max(need, min(want, t_left, r_left))
            exists = con.execute("SELECT 1 FROM reservations WHERE id = ?", [credit_id]).fetchone()
            if exists:
                con.execute("UPDATE reservations SET reserved_usd = reserved_usd + ? WHERE id = ? AND state = 'reserved'", [g, credit_id])
            else:
                con.execute("INSERT INTO reservations VALUES (?, ?, ?, NULL, 'reserved', ?, NULL, 'credit', ?, NULL)",
                            [credit_id, teacher, run_id, g, _now()])
            return g, ""

        return self._with_conn(run)

    def close_calls(self, rows: list[tuple]) -> None:
        """Write closed calls (id, teacher, run_id, call_id, state, reserved, cost, note, credit_id) and move
        the worst case of each settled/kept call out of its credit row; one transaction."""

        def run(con) -> None:
            now = _now()
            out, moved = [], {}
            for rid, teacher, run_id, cid, state, reserved, cost, note, credit_id in rows:
                cost = {"settled": cost, "kept": reserved, "released": 0.0}[state]
                out.append((rid, teacher, run_id, cid, state, reserved, cost, (note or None), now, now))
                if state != "released":
                    moved[credit_id] = moved.get(credit_id, 0.0) + reserved
            con.executemany("INSERT INTO reservations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", out)
            for credit_id, amount in moved.items():
                con.execute("UPDATE reservations SET reserved_usd = GREATEST(reserved_usd - ?, 0) WHERE id = ?", [amount, credit_id])

        if rows:
            self._with_conn(run)

    def release_credits(self, credit_ids: list[str]) -> None:
        """Return the unused part of finished runs' credit rows to their budgets."""
        q = f"UPDATE reservations SET state = 'released', cost_usd = 0, closed_at = ? WHERE state = 'reserved' AND id IN ({','.join('?' * len(credit_ids))})"
        self._with_conn(lambda con: con.execute(q, [_now(), *credit_ids]))

    # -- reads
    def spent(self, teacher: str) -> float:
        """Everything this teacher has cost or may have cost (settled + kept + open reservations)."""
        return self._with_conn(
            lambda con: float(con.execute(f"SELECT COALESCE({_SPENT_EXPR}, 0) FROM reservations WHERE teacher = ?", [teacher]).fetchone()[0])
        )

    def remaining(self, teacher: str, budget: float) -> float:
        return max(0.0, budget - self.spent(teacher))

    def spend_by_run(self, run_id: str) -> dict[str, float]:
        """USD per teacher committed by one run (settled, kept and still-open reservations)."""
        q = f"SELECT teacher, {_SPENT_EXPR} FROM reservations WHERE run_id = ? GROUP BY teacher ORDER BY teacher"
        return self._with_conn(lambda con: {t: float(s or 0) for t, s in con.execute(q, [run_id]).fetchall()})

    def rows(self) -> list[dict[str, Any]]:
        """Every reservation (for audits and tests)."""

        def run(con):
            cur = con.execute("SELECT * FROM reservations ORDER BY created_at, id")
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, r)) for r in cur.fetchall()]

        return self._with_conn(run)


@dataclass
class _Credit:
    id: str  # the credit row in the ledger
    balance: float = 0.0  # granted money not assigned to any call in flight


@dataclass
class _Open:
    teacher: str
    run_id: str
    call_id: str
    amount: float
    credit_id: str


class AsyncLedger:
    """The ledger as seen by one asyncio run: per-teacher credit granted in few transactions.

    Opening DuckDB costs 25–200 ms on a busy 2-core machine, far too much per call. So the run asks
    the ledger for *credit* (one ``reserved`` row per run × teacher, topped up by
    :meth:`Ledger.grant` under the same lock and budget/ceiling checks as single reservations, in
    chunks of about ``max_concurrency`` worst cases) and assigns each call's worst case from it in
    memory. Closing a call writes its own row (settled/kept/released) and moves its worst case out of
    the credit row in one transaction; closes are batched in the background and never awaited by the
    call. At the end :meth:`drain` writes everything and releases the unused credit.

    Money stays safe: the ledger always counts the whole credit row at its reserved amount, so calls
    in flight, closes not yet written and unused credit all count as spent until written. A run
    killed with ``kill -9`` leaves its credit row reserved: at most one chunk of unused credit per
    teacher is over-counted (``teachers budget`` shows it), never anything under-counted.
    """

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self._credits: dict[tuple[str, str], _Credit] = {}
        self._grant_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._refused: dict[tuple[str, str], tuple[int, float, str]] = {}  # (epoch, need, reason)
        self._open: dict[str, _Open] = {}
        self._pending: list[tuple[_Open, str, float | None, str]] = []
        self._flusher: asyncio.Task | None = None
        self._epoch = 0  # bumps when closes are written (budget may have been freed)
        self._topups: set[asyncio.Task] = set()
        self._wake = asyncio.Event()

    async def reserve(self, op: Reserve) -> Reservation:
        key = (op.run_id, op.teacher)
        credit = self._credits.get(key)
        if credit is None or credit.balance + EPS < op.amount_usd:
            lock = self._grant_locks.setdefault(key, asyncio.Lock())
            async with lock:
                credit = self._credits.get(key)
                if credit is None or credit.balance + EPS < op.amount_usd:
                    refused = self._refused.get(key)
                    if refused and refused[0] == self._epoch and op.amount_usd >= refused[1]:
                        return Reservation(False, "", refused[2])
                    if credit is None:
                        credit = self._credits[key] = _Credit(id=uuid.uuid4().hex)
                    need = op.amount_usd - max(credit.balance, 0.0)
                    want = max(need, op.chunk_usd - max(credit.balance, 0.0))
                    granted, reason = await asyncio.to_thread(
                        self.ledger.grant, credit.id, op.teacher, op.budget_usd, op.run_id, op.ceiling_usd, need, want
                    )
                    if granted <= 0 and (self._pending or (self._flusher is not None and not self._flusher.done())):
                        await self._flush_now()  # settles not yet written may free enough: write them, ask again
                        need = op.amount_usd - max(credit.balance, 0.0)
                        granted, reason = await asyncio.to_thread(
                            self.ledger.grant, credit.id, op.teacher, op.budget_usd, op.run_id, op.ceiling_usd, need, max(need, want)
                        )
                    if granted <= 0:
                        self._refused[key] = (self._epoch, op.amount_usd, reason)
                        return Reservation(False, "", reason)
                    credit.balance += granted
        credit.balance -= op.amount_usd
        if credit.balance < op.chunk_usd / 2 and not self._grant_locks.setdefault(key, asyncio.Lock()).locked():
            # top up in the background before the credit runs dry, so calls rarely wait for DuckDB
            task = asyncio.create_task(self._top_up(key, op))
            self._topups.add(task)
            task.add_done_callback(self._topups.discard)
        rid = uuid.uuid4().hex
        self._open[rid] = _Open(op.teacher, op.run_id, op.call_id, op.amount_usd, credit.id)
        return Reservation(True, rid)

    async def _top_up(self, key: tuple[str, str], op: Reserve) -> None:
        lock = self._grant_locks[key]
        if lock.locked():
            return
        async with lock:
            credit = self._credits[key]
            refused = self._refused.get(key)
            if credit.balance >= op.chunk_usd / 2 or (refused and refused[0] == self._epoch):
                return
            try:
                granted, _ = await asyncio.to_thread(self.ledger.grant, credit.id, op.teacher, op.budget_usd, op.run_id,
                                                     op.ceiling_usd, op.amount_usd, op.chunk_usd - credit.balance)
            except Exception:
                return  # the foreground path will ask again and report the error
            credit.balance += granted

    async def close(self, reservation_id: str, state: str, cost_usd: float | None = None, note: str = "") -> None:
        """Queue a settle/keep/release; it is written in the background (see class docstring)."""
        if state not in ("settled", "kept", "released"):
            raise ValueError(f"unknown reservation state {state!r}")
        o = self._open.pop(reservation_id)
        if state == "released":  # never billed: the money is free for the next call of this run
            self._credits[(o.run_id, o.teacher)].balance += o.amount
        self._pending.append((o, state, cost_usd, note))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        try:  # let closes accumulate: one DuckDB transaction for many calls (unless someone needs them now)
            await asyncio.wait_for(self._wake.wait(), FLUSH_DELAY_S)
        except asyncio.TimeoutError:
            pass
        while self._pending:
            batch, self._pending = self._pending, []
            rows = [(uuid.uuid4().hex, o.teacher, o.run_id, o.call_id, state, o.amount, cost, note, o.credit_id)
                    for o, state, cost, note in batch]
            await asyncio.to_thread(self.ledger.close_calls, rows)
            self._epoch += 1

    async def _flush_now(self) -> None:
        """Write queued closes immediately (budget they free may let a refused call through)."""
        self._wake.set()
        try:
            while self._flusher is not None and not self._flusher.done():
                await self._flusher
            if self._pending:
                self._flusher = asyncio.create_task(self._flush())
                await self._flusher
        finally:
            self._wake.clear()

    async def drain(self) -> None:
        """Write every queued close, then release the unused credit of every teacher."""
        while self._topups:
            await asyncio.gather(*list(self._topups))
        await self._flush_now()
        if not self._open:  # with calls still open (a crash in a caller) the credit stays reserved
            ids = [c.id for c in self._credits.values()]
            if ids:
                await asyncio.to_thread(self.ledger.release_credits, ids)

