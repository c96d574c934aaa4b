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

Concurrency: each batch of operations runs inside one exclusive ``flock`` on ``<path>.lock`` and one
DuckDB transaction; the connection is opened and closed inside the lock because DuckDB admits one
writer process per file. Opening costs ~25 ms here, so :class:`AsyncLedger` batches the operations
of all in-flight calls of a run into one transaction. Checks and writes happen under the same lock,
so concurrent reservations (threads, tasks or processes) can never overdraw a budget.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

EPS = 1e-12  # float slack when comparing sums of dollars

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


class AsyncLedger:
    """Batches the ledger operations of concurrent asyncio tasks into one transaction per flush."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self._pending: list[tuple[Reserve | Close, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None

    async def _submit(self, op: Reserve | Close):
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((op, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await asyncio.shield(fut)

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                results = await asyncio.to_thread(self.ledger.apply, [op for op, _ in batch])
            except BaseException as e:  # every waiter learns about it; nothing is sent unreserved
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                if not isinstance(e, Exception):
                    raise
                continue
            for (_, fut), res in zip(batch, results):
                if not fut.done():
                    fut.set_result(res)

    async def reserve(self, op: Reserve) -> Reservation:
        return await self._submit(op)

    async def close(self, reservation_id: str, state: str, cost_usd: float | None = None, note: str = "") -> None:
        await self._submit(Close(reservation_id, state, cost_usd, note))


def default_home() -> Path:
    """``$COMPOSER_PIPELINE_HOME`` or ``~/.cache/composer-pipeline``: ledger, cache, converted models."""
    return Path(os.environ.get("COMPOSER_PIPELINE_HOME") or Path.home() / ".cache" / "composer-pipeline").expanduser()
