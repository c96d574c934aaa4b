"""What one replay run did: THE replay summary, printed by ``composer-pipeline replay`` and shown as the
``teacher_replays`` asset's ``summary`` metadata (one function, one set of key names, one percentile rule).

In:  a ``teacher_replays`` table (one row per state × teacher) and what the run itself observed
     (:class:`RunInfo`). Out: a JSON-able dict whose keys say what they count, so two numbers with
     different meanings never share a name:

* ``rows``: state × teacher rows; ``answered``: rows with an answer (from HTTP or the cache), of which
  ``unparsed`` carry no parseable action; ``failed`` / ``budget_exhausted``: rows without an answer,
  ``failures_by_reason``: those rows counted by the reason's prefix (``http_500``, ``missing_api_key``...);
  ``skipped``: rows never sent by design, ``skipped_by_reason`` by the reason's prefix (``no_user_turn``: the
  prefix holds no user message; ``not_escalated``: escalation stopped before this teacher's tier);
* ``from_cache``: answers taken from the response cache (or from an identical request earlier in the
  same run), no request sent; ``http_requests``: requests sent over HTTP in this run (their
  ``http_attempts`` include retries);
* ``spend_usd`` / ``spend_usd_by_teacher``: what this run paid (``paid_usd``; a cached answer pays 0),
  rounded to 1e-8 USD; every teacher with a row is listed;
* ``prompt_tokens_by_teacher`` / ``cached_prompt_tokens_by_teacher``: prompt tokens of the answers paid
  in this run, and how many of them the provider read from its prompt cache;
* ``usage_flagged_by_teacher``: answers paid in this run whose usage the provider reported beyond what the
  request could be billed (``usage_over_bound``) or not as counts (``usage_invalid``), settled at most at
  their reservation (pricing.settle); a teacher listed here is billing what it cannot have served;
* ``refused``: answers that are a refusal (``status: refused``); ``cut_answers``: answers cut at their token
  limit (``finish_reason`` length / max_tokens; they never vote);
* ``fitted_answers``: answers whose prompt was elided or cut to fit the teacher's window;
  ``over_context_window``: rows still too long after one refit, or never sent (too long even fitted);
* the row counts per teacher under ``by_teacher``;
* ``latency_s_http``: seconds per answer fetched over HTTP in this run; ``latency_s_cached``: the
  latency recorded when a cached answer was bought. Each is :func:`latency_summary`;
* from the run itself: ``reservation_waits`` (waits for money held by other runs' calls in flight),
  ``shared_answers`` (answers another run bought while this one waited for its claim),
  ``disabled_teachers`` (teacher → why it was cut off for this run).

The CLI prints this dict plus where it wrote (``run_id``, ``out``, ``ledger``, ``cache``,
``predicted_vs_billed``) and the names it printed before this summary was unified (:data:`CLI_LEGACY_KEYS`).
Deliberately simplified: money billed with prompt caching is the ledger's (``ledger/billing.py``),
not recounted here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from composer_pipeline.tables import CUT_FINISH_REASONS

_COUNTS = (
    "rows",
    "answered",
    "from_cache",
    "http_requests",
    "http_attempts",
    "failed",
    "budget_exhausted",
    "skipped",
)
PERCENTILES = (50, 90, 95, 99)


def nearest_rank(sorted_values: list[float], pct: int) -> float:
    """The ``pct``-th percentile of ``sorted_values`` (ascending, non-empty) by the nearest-rank method:
    the value at 1-based rank ``ceil(pct / 100 × n)`` (rank 1 for ``pct`` 0), always an observed value;
    the median of an even count is the lower of the two middle values. Source: Wikipedia, "Percentile",
    section "The nearest-rank method"; = Hyndman & Fan (1996), "Sample quantiles in statistical packages",
    definition 1 (inverse of the empirical distribution function) = ``numpy.percentile(method="inverted_cdf")``.
    Integer arithmetic, so ``pct × n`` that is a whole number is never off by a float's last bit."""
    n = len(sorted_values)
    rank = max(1, -(-pct * n // 100))  # ceil(pct * n / 100)
    return sorted_values[min(rank, n) - 1]


def latency_summary(values: list[float]) -> dict[str, Any]:
    """``{"n", "p50", "p90", "p95", "p99", "max", "mean"}`` of ``values`` in seconds (percentiles by
    :func:`nearest_rank`), rounded to ms; ``{"n": 0}`` when there are none."""
    if not values:
        return {"n": 0}
    v = sorted(float(x) for x in values)
    return {
        "n": len(v),
        **{f"p{p}": round(nearest_rank(v, p), 3) for p in PERCENTILES},
        "max": round(v[-1], 3),
        "mean": round(sum(v) / len(v), 3),
    }


@dataclass
class RunInfo:
    """What a replay run observed besides its rows (see the module docstring)."""

    reservation_waits: int = 0
    shared_answers: int = 0
    disabled_teachers: dict[str, str] = field(default_factory=dict)


_COLUMNS = [
    "teacher",
    "status",
    "reason",
    "action",
    "cache_hit",
    "attempts",
    "latency_s",
    "paid_usd",
    "prompt_tokens",
    "cached_tokens",
    "elided_messages",
    "cut_messages",
    "finish_reason",
]
USAGE_FLAGS = ("usage_over_bound", "usage_invalid")


def replay_summary(table: pa.Table, info: RunInfo | None = None) -> dict[str, Any]:
    """See the module docstring."""
    info = info or RunInfo()
    total = dict.fromkeys(_COUNTS, 0)
    by_teacher: dict[str, dict[str, int]] = {}
    spend: dict[str, float] = {}
    prompt_tokens: dict[str, int] = {}
    cached_tokens: dict[str, int] = {}
    failures: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    unparsed = fitted = over_window = refused = cut = 0
    flagged: Counter[str] = Counter()
    http_lat: list[float] = []
    cached_lat: list[float] = []
    for r in table.select(_COLUMNS).to_pylist():
        name, status, reason = r["teacher"], r["status"], r["reason"] or ""
        t = by_teacher.setdefault(name, dict.fromkeys(_COUNTS, 0))
        cache_hit, attempts = bool(r["cache_hit"]), r["attempts"] or 0
        sent = not cache_hit and attempts > 0
        inc = {
            "rows": 1,
            "answered": status == "answered",
            "from_cache": cache_hit,
            "http_requests": sent,
            "http_attempts": attempts if sent else 0,
            "failed": status == "failed",
            "budget_exhausted": status == "budget_exhausted",
            "skipped": status == "skipped",
        }
        for k, n in inc.items():
            t[k] += int(n)
            total[k] += int(n)
        spend[name] = spend.get(name, 0.0) + (0.0 if cache_hit else float(r["paid_usd"] or 0.0))
        if not cache_hit:
            prompt_tokens[name] = prompt_tokens.get(name, 0) + (r["prompt_tokens"] or 0)
            cached_tokens[name] = cached_tokens.get(name, 0) + (r["cached_tokens"] or 0)
        if not cache_hit and any(f in reason for f in USAGE_FLAGS):
            flagged[name] += 1
        refused += status == "refused"
        cut += status == "answered" and r["finish_reason"] in CUT_FINISH_REASONS
        if status == "answered":
            unparsed += r["action"] is None
            fitted += bool(r["elided_messages"] or r["cut_messages"])
            if r["latency_s"] is not None:
                (cached_lat if cache_hit else http_lat).append(float(r["latency_s"]))
        elif status == "skipped":
            skipped[reason.split(":", 1)[0] or status] += 1
        else:
            failures[reason.split(":", 1)[0] or status] += 1
        over_window += reason.startswith("over_context_window")
    return {
        **total,
        "unparsed": unparsed,
        "failures_by_reason": dict(sorted(failures.items())),
        "skipped_by_reason": dict(sorted(skipped.items())),
        "spend_usd": round(sum(spend.values()), 8),
        "spend_usd_by_teacher": {k: round(v, 8) for k, v in sorted(spend.items())},
        "prompt_tokens_by_teacher": dict(sorted(prompt_tokens.items())),
        "cached_prompt_tokens_by_teacher": dict(sorted(cached_tokens.items())),
        "usage_flagged_by_teacher": dict(sorted(flagged.items())),
        "refused": refused,
        "cut_answers": cut,
        "fitted_answers": fitted,
        "over_context_window": over_window,
        "by_teacher": dict(sorted(by_teacher.items())),
        "latency_s_http": latency_summary(http_lat),
        "latency_s_cached": latency_summary(cached_lat),
        "reservation_waits": info.reservation_waits,
        "shared_answers": info.shared_answers,
        "disabled_teachers": dict(sorted(info.disabled_teachers.items())),
    }


# The names ``composer-pipeline replay`` printed before its summary and the asset's were one (issue 23),
# each still printed by the CLI beside the summary's own name for scripts written against them:
# old name -> (summary key, key inside it or None).
CLI_LEGACY_KEYS: dict[str, tuple[str, str | None]] = {
    "calls": ("http_requests", None),
    "attempts": ("http_attempts", None),
    "cache_hits": ("from_cache", None),
    "total_spend": ("spend_usd", None),
    "spend_by_teacher": ("spend_usd_by_teacher", None),
    "latency_p50_s": ("latency_s_http", "p50"),
    "latency_p95_s": ("latency_s_http", "p95"),
    "latency_mean_s": ("latency_s_http", "mean"),
}


def cli_legacy_keys(summary: dict[str, Any]) -> dict[str, Any]:
    """The old CLI names of ``summary``'s numbers (:data:`CLI_LEGACY_KEYS`; a latency is None without answers)."""
    return {old: summary[key] if sub is None else summary[key].get(sub) for old, (key, sub) in CLI_LEGACY_KEYS.items()}
