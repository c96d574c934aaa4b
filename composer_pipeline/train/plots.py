"""Loss-curve PNGs, one per channel (grpo, sdpo, dpo) plus the weighted total.

In:  the per-step records of the trainer (``losses.jsonl`` rows) and the channels reported off.
Out: ``loss_<channel>.png`` files (matplotlib, Agg backend: no display needed); an off channel
     gets a PNG that says it was off and why, so a missing curve is never mistaken for a flat one.

Deliberately simplified: raw per-step values, no smoothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_losses(losses: list[dict[str, Any]], out_dir: Path, *, off_reasons: dict[str, str] | None = None) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    off_reasons = off_reasons or {}
    plots: dict[str, Path] = {}
    for ch in ("grpo", "sdpo", "dpo", "total"):
        pts = [(r["step"], r[ch]) for r in losses if r.get(ch) is not None]
        fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3)
            ax.set_xlabel("step")
            ax.set_ylabel(f"{ch} loss")
        else:
            why = off_reasons.get(ch, "no values logged")
            ax.text(0.5, 0.5, f"{ch}: off\n({why})", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
        ax.set_title(f"{ch} loss per step")
        fig.tight_layout()
        path = out_dir / f"loss_{ch}.png"
        fig.savefig(path)
        plt.close(fig)
        plots[ch] = path
    return plots
