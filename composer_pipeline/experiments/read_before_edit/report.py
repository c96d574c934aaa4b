"""The read-before-edit experiment's report: finished cells -> results, table with paired intervals, plots.

In:  every finished arm × seed cell under the run's directory (``cells/``).
Out: ``results.jsonl`` (one row per arm × seed), ``per_kind.jsonl`` (seed × arm × state kind),
     ``states.jsonl`` (seed × arm × held-out state, with the answer's full text), ``table.md`` (per-kind
     shares, paired 95% t intervals against the start and between each arm and its control: :data:`CONTRASTS`),
     ``curves.json`` / ``curves.png``.

Deliberately simplified: intervals are Student's t over the per-seed paired differences (no bootstrap,
no correction for the several contrasts).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from composer_pipeline.experiments.read_before_edit.arms import ARMS
from composer_pipeline.experiments.read_before_edit.config import ExperimentConfig
from composer_pipeline.experiments.read_before_edit.probe import STATE_KINDS


def collect(out: Path, cfg: ExperimentConfig | None = None) -> dict[str, Any]:
    """Every finished cell under ``out`` -> ``results.jsonl`` (one row per arm × seed),
    ``per_kind.jsonl`` (one line per seed × arm × state kind), ``states.jsonl`` (one line per
    held-out state × arm × seed), ``curves.json``/``curves.png`` and ``table.md``."""
    cells = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("seed*.json"))]
    order = {a: i for i, a in enumerate(cfg.arms if cfg else ARMS)}
    cells.sort(key=lambda c: (c["row"]["seed"], order.get(c["row"]["arm"], 99)))
    results = [c["row"] for c in cells]
    with (out / "results.jsonl").open("w") as f:
        for r in results:
            f.write(json.dumps({k: v for k, v in r.items() if k != "kinds"}) + "\n")
    with (out / "per_kind.jsonl").open("w") as f:
        for r in results:
            for kind, v in r["kinds"].items():
                f.write(json.dumps({"seed": r["seed"], "arm": r["arm"], "kind": kind, **v}) + "\n")
    with (out / "states.jsonl").open("w") as f:
        for c in cells:
            for o in c["outputs"]:
                f.write(
                    json.dumps(
                        {
                            "seed": c["row"]["seed"],
                            "arm": c["row"]["arm"],
                            "state_id": o["state_id"],
                            "state": o["state"],
                            "hit": o["hit"],
                            "tool_hit": o["tool_hit"],
                            "answer": o["answer"],
                            "parsed": o.get("parsed"),
                            "parse_error": o.get("parse_error"),
                            "text": o.get("text"),
                        },
                        separators=(",", ":"),
                    )
                    + "\n"
                )
    curves: dict[str, list] = {}
    for c in cells:
        curves.setdefault(c["row"]["arm"], []).append(c["curve"])
    (out / "curves.json").write_text(json.dumps(curves))
    table = summary_table(results) if results else "(no finished cells)"
    (out / "table.md").write_text(table + "\n")
    if results:
        plot_curves(curves, out / "curves.png")
    return {"results": results, "table": table}


def _mean_std(values: Sequence[float | None], *, signed: bool = False, digits: int = 3) -> str:
    """``mean ± sd`` of the values given (None: not measured, left out); ``n/a`` when none is."""
    xs = [x for x in values if x is not None]
    if not xs:
        return "n/a"
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return f"{m:{'+' if signed else ''}.{digits}f} ± {sd:.{digits}f}"


# two-sided 95% quantiles of Student's t by degrees of freedom (any statistics table, e.g. NIST/SEMATECH
# e-Handbook of Statistical Methods, 1.3.6.7.2); beyond 30 the normal 1.96
_T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    20: 2.086,
    25: 2.060,
    30: 2.042,
}


def paired_interval(diffs: list[float]) -> tuple[float, float, float] | None:
    """Mean of per-seed differences and its 95% t interval ``(mean, low, high)``; None under 2 seeds."""
    n = len(diffs)
    if n < 2:
        return None
    m = sum(diffs) / n
    sd = math.sqrt(sum((d - m) ** 2 for d in diffs) / (n - 1))
    t = _T975.get(n - 1) or next((v for k, v in sorted(_T975.items()) if k >= n - 1), 1.96)
    half = t * sd / math.sqrt(n)
    return m, m - half, m + half


def _fmt_interval(iv: tuple[float, float, float] | None, n: int) -> str:
    if iv is None:
        return f"n/a ({n} seed{'s' if n != 1 else ''})"
    return f"{iv[0]:+.3f} [{iv[1]:+.3f}, {iv[2]:+.3f}]"


# the comparisons the controls exist for: (arm, control) -> what a difference that excludes 0 says
CONTRASTS = [
    ("dpo", "nll", "the preference term adds to the NLL on the chosen answers"),
    ("dpo_differing", "nll", "the preference term over the differing tokens adds to the NLL"),
    ("dpo_differing", "dpo", "summing the preference term over the differing tokens only matters"),
    ("dpo_first", "nll", "the preference term on the first differing token adds to the NLL"),
    ("dpop", "nll", "the DPO-Positive preference term adds to the NLL"),
    ("dpop", "dpo", "the DPOP penalty (chosen answers kept at or above the start) matters"),
    ("nll", "nll_all", "selecting the states where the agent disagreed matters (vs the consensus everywhere)"),
    ("dpo", "dpo_shuffled", "the pairs' labels carry the DPO gain"),
    ("grpo", "grpo_shuffled", "the error-sites-first order matters to GRPO"),
    ("all", "dpo", "GRPO + hint-SDPO add to DPO"),
    ("dpo", "grpo", "DPO beats GRPO at the same steps"),
]


def _paired(results: list[dict], a: str, b: str, key: str = "combined") -> list[float]:
    by = {(r["arm"], r["seed"]): r.get(key) for r in results}
    pairs = ((by[(arm, s)], by.get((b, s))) for (arm, s) in sorted(by) if arm == a)
    return [x - y for x, y in pairs if x is not None and y is not None]


def summary_table(results: list[dict]) -> str:
    """Per arm: the combined score on the decisive states (min of reading an unread target, editing a
    once-read one), its change from the start policy *of the same seed* with a 95% paired t interval,
    and the exact-hit share per state kind; then the controls' paired contrasts and the winner."""
    arms = list(dict.fromkeys(r["arm"] for r in results))
    head = (
        "| arm | seeds | combined (decisive) | Δ combined vs start [95% CI] | decisive read | decisive edit | parse rate | "
        + " | ".join(k.replace("_", " ") for k in STATE_KINDS)
        + " | steps | seconds |"
    )
    lines = [head, "|" + "---|" * (9 + len(STATE_KINDS))]
    for arm in arms:
        rs = [r for r in results if r["arm"] == arm]
        d = "—" if arm == "start" else _fmt_interval(paired_interval(_paired(results, arm, "start")), len(rs))
        kinds = " | ".join(
            _mean_std([(r.get("kinds") or {}).get(k, {}).get("hit") for r in rs], digits=2) for k in STATE_KINDS
        )
        lines.append(
            f"| {arm} | {len(rs)} | {_mean_std([r.get('combined') for r in rs])} | {d} "
            f"| {_mean_std([r.get('decisive_read') for r in rs], digits=2)} | {_mean_std([r.get('decisive_edit') for r in rs], digits=2)} "
            f"| {_mean_std([r.get('parse_rate') for r in rs], digits=2)} | {kinds} | {rs[0]['steps']} | {_mean_std([r['seconds'] for r in rs], digits=0)} |"
        )
    contrasts = [(a, b, why) for a, b, why in CONTRASTS if a in arms and b in arms]
    if contrasts:
        lines += [
            "",
            "| contrast (combined, paired over seeds) | seeds | mean [95% CI] | reading if the interval excludes 0 |",
            "|---|---|---|---|",
        ]
        for a, b, why in contrasts:
            ds = _paired(results, a, b)
            lines.append(f"| {a} − {b} | {len(ds)} | {_fmt_interval(paired_interval(ds), len(ds))} | {why} |")
    combined = {a: [r["combined"] for r in results if r["arm"] == a and r.get("combined") is not None] for a in arms}
    means = {a: sum(v) / len(v) for a, v in combined.items() if v}
    if len(means) > 1:
        best = max(means, key=means.__getitem__)
        beaten = []
        for other in sorted(means, key=means.__getitem__, reverse=True)[1:]:
            iv = paired_interval(_paired(results, best, other))
            beaten.append(f"{other} {_fmt_interval(iv, 0)}" + ("" if iv is None or iv[1] > 0 else " (not excluded 0)"))
        lines += [
            "",
            f"Highest mean combined: **{best}** ({means[best]:.3f}); paired differences: " + "; ".join(beaten),
        ]
    return "\n".join(lines)


def plot_curves(curves: dict[str, list[list[dict]]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key in zip(axes, ("read_when_unread", "edit_when_read")):
        for arm, runs in curves.items():
            steps = sorted({p["step"] for run in runs for p in run})
            ys = []
            for s in steps:
                vals = [p[key] for run in runs for p in run if p["step"] == s and p[key] is not None]
                ys.append(sum(vals) / len(vals) if vals else float("nan"))
            # an arm that does not train (start): its level as a reference line
            if len(steps) == 1:
                ax.axhline(ys[0], linestyle="--", color="grey", label=arm)
            else:
                ax.plot(steps, ys, marker="o", label=arm)
        ax.set_title(f"held-out {key} (mean over seeds)")
        ax.set_xlabel("trainer step")
        ax.set_ylim(-0.05, 1.05)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
