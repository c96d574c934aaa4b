"""The DuckDB ledger's single-call API: reserve refuses past a budget or a ceiling, settle/keep/release
count as documented, and spend survives re-opening the file (budgets hold across runs and days)."""

from __future__ import annotations

import pytest

from composer_pipeline.teachers.ledger import Ledger


def test_reserve_settle_keep_release(tmp_path):
    led = Ledger(tmp_path / "ledger.duckdb")
    a = led.reserve("t", 0.4, budget_usd=1.0, run_id="r1", ceiling_usd=10.0, call_id="c1")
    b = led.reserve("t", 0.4, budget_usd=1.0, run_id="r1", ceiling_usd=10.0, call_id="c2")
    assert a.ok and b.ok and led.spent("t") == pytest.approx(0.8)
    c = led.reserve("t", 0.4, budget_usd=1.0, run_id="r1", ceiling_usd=10.0)
    assert not c.ok and "teacher budget" in c.reason  # 0.8 + 0.4 > 1.0: refused, nothing recorded
    led.settle(a.id, 0.05)  # actual usage: frees the rest of the reservation
    led.release(b.id)  # never billed
    assert led.spent("t") == pytest.approx(0.05)
    d = led.reserve("t", 0.4, budget_usd=1.0, run_id="r2", ceiling_usd=0.3)
    assert not d.ok and "run ceiling" in d.reason
    e = led.reserve("t", 0.2, budget_usd=1.0, run_id="r2", ceiling_usd=0.3)
    led.keep(e.id, note="timeout: outcome unknown")  # may have been billed: counted at worst case
    assert led.spent("t") == pytest.approx(0.25)
    assert led.spend_by_run("r1") == {"t": pytest.approx(0.05)} and led.spend_by_run("r2") == {"t": pytest.approx(0.2)}
    again = Ledger(tmp_path / "ledger.duckdb")  # another day, another process
    assert again.remaining("t", 1.0) == pytest.approx(0.75) and again.spent("other") == 0
    states = sorted(r["state"] for r in again.rows())
    assert states == ["kept", "released", "settled"]


def test_open_reservation_of_a_dead_run_counts_as_spent(tmp_path):
    led = Ledger(tmp_path / "ledger.duckdb")
    led.reserve("t", 0.3, budget_usd=1.0, run_id="killed", ceiling_usd=1.0)  # never settled
    assert Ledger(tmp_path / "ledger.duckdb").spent("t") == pytest.approx(0.3)
