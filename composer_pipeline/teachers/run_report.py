"""What one replay run did, named by what is counted (the ``teacher_replays`` asset's ``summary``).

In:  a ``teacher_replays`` table (one row per state × teacher). Out: a JSON-able dict whose keys say
     what they count, so two numbers with different meanings never share a name:

* ``rows``: state × teacher rows; ``answered``: rows with an answer (from HTTP or the cache);
* ``from_cache``: answers taken from the response cache (or from an identical request earlier in the
  same run), no request sent; ``http_requests``: requests sent over HTTP in this run (their
  ``http_attempts`` include retries); ``failed`` / ``budget_exhausted``: rows without an answer;
* the same counts per teacher under ``by_teacher``;
* ``latency_s_http``: seconds per answer fetched over HTTP in this run; ``latency_s_cached``: the
  latency recorded when a cached answer was bought (the preview's ``latency_s`` column mixes both,
  next to ``cache_hit``). Each is ``{"n", "p50", "p90", "p99", "max"}`` or ``{"n": 0}``.

Money is not summarized here (the asset's ``spend_usd*`` entries and the ledger say what was paid).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

_COUNTS = ("rows", "answered", "from_cache", "http_requests", "http_attempts", "failed", "budget_exhausted")


def latency_summary(values: list[float]) -> dict[str, Any]:
    """Count and nearest-rank percentiles of ``values`` (seconds, rounded to ms)."""
    if not values:
        return {"n": 0}
    v = sorted(values)

    def pick(q: float) -> float:
        return round(float(v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]), 3)

    return {"n": len(v), "p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "max": round(float(v[-1]), 3)}


def replay_summary(table: pa.Table) -> dict[str, Any]:
    """See the module docstring."""
    total = dict.fromkeys(_COUNTS, 0)
    by_teacher: dict[str, dict[str, int]] = {}
    http_lat: list[float] = []
    cached_lat: list[float] = []
    cols = ["teacher", "status", "cache_hit", "attempts", "latency_s"]
    for r in table.select(cols).to_pylist():
        t = by_teacher.setdefault(r["teacher"], dict.fromkeys(_COUNTS, 0))
        sent = not r["cache_hit"] and (r["attempts"] or 0) > 0
        inc = {
            "rows": 1,
            "answered": r["status"] == "answered",
            "from_cache": bool(r["cache_hit"]),
            "http_requests": sent,
            "http_attempts": (r["attempts"] or 0) if sent else 0,
            "failed": r["status"] == "failed",
            "budget_exhausted": r["status"] == "budget_exhausted",
        }
        for k, n in inc.items():
            t[k] += int(n)
            total[k] += int(n)
        if r["status"] == "answered" and r["latency_s"] is not None:
            (cached_lat if r["cache_hit"] else http_lat).append(float(r["latency_s"]))
    return {
        **total,
        "by_teacher": dict(sorted(by_teacher.items())),
        "latency_s_http": latency_summary(http_lat),
        "latency_s_cached": latency_summary(cached_lat),
    }
