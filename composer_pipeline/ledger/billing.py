"""What providers billed, read from the ledger's ``billed_usage`` (schema version 3): money and cached tokens.

In:  a :class:`~composer_pipeline.ledger.Ledger`.
Out: per teacher (or per run, or beside a cost plan's prediction: :func:`predicted_vs_billed`):
     ``billed_usd`` (what settled calls were billed, cache reads and writes at their own prices),
     ``full_price_usd`` (the same tokens at the full input price: what a ledger blind to caching would
     have recorded), ``prompt_tokens``, ``cached_prompt_tokens``, ``cache_write_tokens``, ``settled_calls``.

Deliberately simplified: sums on read (an audit-sized query), no running totals; kept calls (outcome
unknown) are in the ledger's ``kept_usd`` at their worst case and have no usage to split.
"""

from __future__ import annotations

from typing import Any

from composer_pipeline.ledger import Ledger

_SUMS = (
    "COUNT(*), COALESCE(SUM(billed_usd), 0), COALESCE(SUM(full_price_usd), 0), COALESCE(SUM(prompt_tokens), 0), "
    "COALESCE(SUM(cached_tokens), 0), COALESCE(SUM(cache_write_tokens), 0)"
)


def _row(r) -> dict[str, Any]:
    n, usd, full, p, cached, writes = r or (0, 0, 0, 0, 0, 0)
    return {
        "settled_calls": int(n),
        "billed_usd": round(float(usd), 8),
        "full_price_usd": round(float(full), 8),
        "prompt_tokens": int(p),
        "cached_prompt_tokens": int(cached),
        "cache_write_tokens": int(writes),
    }


def usage_by_teacher(ledger: Ledger, teacher: str) -> dict[str, Any]:
    """Billed money and cached tokens of every settled call of ``teacher`` (all runs)."""
    return _row(
        ledger._tx(lambda c: c.one(f"SELECT {_SUMS} FROM billed_usage WHERE teacher = ?", [teacher]), write=False)
    )


def usage_by_run(ledger: Ledger, run_id: str) -> dict[str, dict[str, Any]]:
    """Per teacher: billed money and cached tokens of the calls one run settled."""
    rows = ledger._tx(
        lambda c: c.all(
            f"SELECT teacher, {_SUMS} FROM billed_usage WHERE run_id = ? GROUP BY teacher ORDER BY teacher", [run_id]
        ),
        write=False,
    )
    return {r[0]: _row(r[1:]) for r in rows}


def predicted_vs_billed(plan, ledger: Ledger, run_id: str, teachers: list[str]) -> dict[str, dict[str, Any]]:
    """Per teacher: the cost plan's expectation (``predicted_usd`` with prompt caching, ``worst_case_usd``,
    what reservations hold) beside what providers billed ``run_id`` (:func:`usage_by_run`). The one shape
    the CLI's replay summary and the ``teacher_replays`` asset both show."""
    billed = usage_by_run(ledger, run_id)
    return {
        name: {
            "predicted_usd": round(plan.predicted_by_teacher.get(name, 0.0), 8),
            "worst_case_usd": round(plan.worst_case_by_teacher.get(name, 0.0), 8),
            **billed.get(name, _row(None)),
        }
        for name in teachers
    }
