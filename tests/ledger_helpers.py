"""Ledger calls that only the tests make, beside the tests: every row of a table, one run's spend, the
schema version, and a reserve that blocks. The pipeline reserves through ``AsyncLedger`` (which waits
with backoff) and reads money through ``Ledger.balance``/``spent``/``room``; these read the tables with
raw SQL in the ledger's own transactions (``Ledger._tx``: its connection, retries and outage handling).

In:  a :class:`~composer_pipeline.ledger.Ledger`. Out: rows as dicts, sums, a ``Reservation``.
Deliberately simplified: ``reserve`` polls ``try_reserve`` on a fixed interval (the asyncio run backs off).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from composer_pipeline.ledger import Ledger, Reservation, Reserve

ORDER = {
    "reservations": "created_at, id",
    "claims": "created_at, call_id",
    "runs": "started_at, run_id",
    "totals": "scope, key",
    "waiters": "created_at, id",
    "teacher_identities": "teacher",
    "billed_usage": "created_at, reservation_id",
    "batches": "created_at, id",
    "batch_calls": "updated_at, call_id",
}


def ledger_rows(ledger: Ledger, table: str = "reservations") -> list[dict[str, Any]]:
    """Every row of one ledger table, in a stable order."""
    if table not in ORDER:
        raise ValueError(f"no ledger table {table!r}")

    def run(c):
        cur = c.execute(f"SELECT * FROM {table} ORDER BY {ORDER[table]}")
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]

    return ledger._tx(run, write=False)


def spend_by_run(ledger: Ledger, run_id: str) -> dict[str, float]:
    """USD per teacher committed by one run (settled, kept and still-open reservations)."""
    q = (
        "SELECT teacher, SUM(CASE state WHEN 'settled' THEN cost_usd WHEN 'released' THEN 0 ELSE reserved_usd END) "
        "FROM reservations WHERE run_id = ? GROUP BY teacher ORDER BY teacher"
    )
    return {t: float(s or 0) for t, s in ledger._tx(lambda c: c.all(q, [run_id]), write=False)}


def schema_version(ledger: Ledger) -> int:
    return int(ledger._tx(lambda c: c.one("SELECT MAX(version) FROM schema_migrations")[0], write=False))


def reserve(
    ledger: Ledger,
    teacher: str,
    amount_usd: float,
    *,
    budget_usd: float,
    run_id: str,
    ceiling_usd: float,
    call_id: str = "",
    wait_s: float = 0.0,
    poll_s: float = 0.02,
) -> Reservation:
    """Reserve, waiting up to ``wait_s`` for money held in flight; refused when it cannot fit (a wait that
    timed out leaves no waiter behind)."""
    op = Reserve(teacher, budget_usd, run_id, ceiling_usd, amount_usd, call_id)
    waiter = uuid.uuid4().hex
    deadline = time.monotonic() + wait_s
    while True:
        res = ledger.try_reserve(op, waiter)
        if not res.wait or time.monotonic() >= deadline:
            if res.wait:
                ledger._tx(lambda c: c.execute("DELETE FROM waiters WHERE id = ?", [waiter]))
            return res
        time.sleep(poll_s)
