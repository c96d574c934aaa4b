"""The one replay summary (replay/report.py) and its one percentile rule (issue 23).

Before, ``replay.summarize`` (the CLI) took the median of two latencies as the lower one and
``run_report.replay_summary`` (the asset) as the upper one. Now both read one dict whose percentiles
are nearest-rank (Hyndman & Fan definition 1), checked here against numpy's ``inverted_cdf``.
"""

import random

import numpy as np
import pyarrow as pa

from composer_pipeline import tables
from composer_pipeline.replay.report import cli_legacy_keys, latency_summary, nearest_rank, replay_summary


def _row(
    teacher: str,
    status: str = "answered",
    *,
    latency: float | None = 0.1,
    cache_hit: bool = False,
    paid: float = 0.01,
    reason: str | None = None,
    action: str | None = '{"name": "Read"}',
    attempts: int = 1,
    **extra,
) -> dict:
    row = {name: None for name in tables.TEACHER_REPLAYS.names}
    row.update(
        teacher=teacher,
        model="m",
        state_id="s",
        call_id=f"c{random.random()}",
        status=status,
        reason=reason,
        action=action if status == "answered" else None,
        cost_usd=paid,
        paid_usd=0.0 if cache_hit else paid,
        reserved_usd=0.0,
        latency_s=latency,
        attempts=attempts,
        cache_hit=cache_hit,
        prompt_tokens=100,
        cached_tokens=0,
        elided_messages=0,
        cut_messages=0,
    )
    row.update(extra)
    return row


def _table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=tables.TEACHER_REPLAYS)


def test_even_count_median_is_the_lower_middle_value_everywhere():
    # two answers over HTTP: the old asset summary said p50 = 0.2, the old CLI summary 0.1
    s = replay_summary(_table([_row("a", latency=0.2), _row("a", latency=0.1)]))
    assert s["latency_s_http"]["p50"] == 0.1 and cli_legacy_keys(s)["latency_p50_s"] == 0.1
    # four: nearest rank ceil(0.5 * 4) = 2 -> the second smallest (both old rules gave the third)
    assert latency_summary([0.4, 0.1, 0.3, 0.2]) == {
        "n": 4,
        "p50": 0.2,
        "p90": 0.4,
        "p95": 0.4,
        "p99": 0.4,
        "max": 0.4,
        "mean": 0.25,
    }
    # six: rank 3 (the old CLI rule gave the third, the old asset rule the fourth)
    assert latency_summary([6, 5, 4, 3, 2, 1])["p50"] == 3
    assert latency_summary([]) == {"n": 0}


def test_nearest_rank_is_numpys_inverted_cdf():
    rng = random.Random(23)
    for n in range(1, 120):
        v = sorted(rng.random() for _ in range(n))
        for p in (0, 1, 10, 25, 50, 90, 95, 99, 100):
            assert nearest_rank(v, p) == float(np.percentile(v, p, method="inverted_cdf")), (n, p)
    twenty = [float(i) for i in range(1, 21)]
    assert nearest_rank(twenty, 95) == 19.0 and nearest_rank(twenty, 99) == 20.0 and nearest_rank(twenty, 90) == 18.0


def test_summary_counts_each_number_once_under_one_name():
    rows = [
        _row("a", latency=0.5, attempts=2),
        # bought earlier: its latency is the cached one, it paid nothing now
        _row("a", cache_hit=True, latency=9.0),
        _row("a", "failed", reason="http_500: server error", latency=None, attempts=3),
        _row("b", "budget_exhausted", reason="budget_exhausted: teacher b", latency=None, attempts=0, paid=0.0),
        # answered, nothing parseable, prompt fitted
        _row("b", action=None, latency=0.3, elided_messages=2),
        _row("b", "failed", reason="over_context_window: still too long", latency=None),
    ]
    s = replay_summary(_table(rows))
    assert {
        k: s[k]
        for k in (
            "rows",
            "answered",
            "unparsed",
            "failed",
            "budget_exhausted",
            "from_cache",
            "http_requests",
            "http_attempts",
            "fitted_answers",
            "over_context_window",
        )
    } == {
        "rows": 6,
        "answered": 3,
        "unparsed": 1,
        "failed": 2,
        "budget_exhausted": 1,
        "from_cache": 1,
        "http_requests": 4,
        "http_attempts": 7,
        "fitted_answers": 1,
        "over_context_window": 1,
    }
    assert s["failures_by_reason"] == {"budget_exhausted": 1, "http_500": 1, "over_context_window": 1}
    assert s["spend_usd_by_teacher"] == {"a": 0.02, "b": 0.02} and s["spend_usd"] == 0.04
    assert s["by_teacher"]["a"]["from_cache"] == 1 and s["by_teacher"]["b"]["budget_exhausted"] == 1
    assert s["latency_s_http"]["n"] == 2 and s["latency_s_cached"] == latency_summary([9.0])
    old = cli_legacy_keys(s)
    assert (old["calls"], old["attempts"], old["cache_hits"], old["total_spend"]) == (4, 7, 1, 0.04)
    assert (old["latency_p50_s"], old["latency_p95_s"]) == (0.3, 0.5) and old["spend_by_teacher"] is s[
        "spend_usd_by_teacher"
    ]
