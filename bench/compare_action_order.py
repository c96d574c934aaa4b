"""Run 6 (bench/RESULTS.md): the read-before-edit cells under two ``render.action_order`` values, side by side.

In:  ``--run ORDER=DIR`` for each run (its ``results.jsonl``: written by ``composer-pipeline experiment
     read-before-edit``), e.g. ``--run sorted=runs/rbe-sorted6 --run name_first=runs/rbe-namefirst``.
Out: Markdown on stdout: one row per seed × order × arm (parse rate, failures by reason, the right tool
     at unread / read targets), then paired 95% t intervals over the seeds both cells share.

Deliberately simplified: the contrasts are the ones run 6 names (``--contrast`` adds others); pairing is
by seed only, so two runs compared here must use the same seeds and sizes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from composer_pipeline.experiments.read_before_edit.report import paired_interval

COLUMNS = {"parse": "parse_rate", "read": "read_tool_when_unread", "edit": "edit_tool_when_read"}
# (order a, arm a, order b, arm b): a − b
CONTRASTS = (
    ("name_first", "dpo", "sorted", "dpo"),
    ("name_first", "dpo", "name_first", "nll"),
    ("sorted", "dpo", "sorted", "nll"),
    ("name_first", "nll", "sorted", "nll"),
    ("name_first", "start", "sorted", "start"),
    ("name_first", "dpo_first", "sorted", "dpo_first"),
    ("name_first", "dpo_first", "name_first", "dpo"),
    ("name_first", "dpo_first", "name_first", "nll"),
)


def load(runs: list[str]) -> dict[tuple[str, str, int], dict]:
    cells = {}
    for spec in runs:
        order, _, root = spec.partition("=")
        for line in (Path(root) / "results.jsonl").read_text().splitlines():
            row = json.loads(line)
            cells[(order, row["arm"], row["seed"])] = row
    return cells


def cell_table(cells: dict) -> str:
    out = [
        "| seed | order | arm | parse rate | failures | Read when unread | Edit when read | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for order, arm, seed in sorted(cells, key=lambda k: (k[2], k[0], k[1])):
        r = cells[(order, arm, seed)]
        fails = ", ".join(f"{k} {v}" for k, v in sorted((r.get("parse_errors") or {}).items())) or "—"
        out.append(
            f"| {seed} | {order} | {arm} | {r['parse_rate']:.3f} | {fails} | {r['read_tool_when_unread']:.2f} "
            f"| {r['edit_tool_when_read']:.2f} | {r['seconds']} |"
        )
    return "\n".join(out)


def contrast_table(cells: dict, contrasts) -> str:
    out = ["| contrast | seeds | parse rate | Read when unread | Edit when read |", "|---|---|---|---|---|"]
    for oa, aa, ob, ab in contrasts:
        seeds = sorted({s for o, a, s in cells if (o, a) == (oa, aa)} & {s for o, a, s in cells if (o, a) == (ob, ab)})
        if not seeds:
            continue
        parts = []
        for key in COLUMNS.values():
            iv = paired_interval([cells[(oa, aa, s)][key] - cells[(ob, ab, s)][key] for s in seeds])
            parts.append("n/a" if iv is None else f"{iv[0]:+.3f} [{iv[1]:+.3f}, {iv[2]:+.3f}]")
        out.append(f"| `{aa}` {oa} − `{ab}` {ob} | {len(seeds)} | " + " | ".join(parts) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="append", required=True, help="ORDER=DIR (a read-before-edit out dir)")
    ap.add_argument("--contrast", action="append", default=[], help="ORDER:ARM-ORDER:ARM, added to run 6's")
    args = ap.parse_args()
    cells = load(args.run)
    extra = []
    for c in args.contrast:
        a, b = c.split("-")
        extra.append((*a.split(":"), *b.split(":")))
    print(cell_table(cells))
    print()
    print(contrast_table(cells, (*CONTRASTS, *extra)))


if __name__ == "__main__":
    main()
