"""Loss-curve PNGs: the one plotting module (the trainer's checkpoint and the ``trained_policy`` asset).

In:  the per-step records of the trainer (``losses.jsonl`` rows) and the channels reported off.
Out: :func:`plot_losses`: ``loss_<channel>.png`` files, one per channel (grpo, sdpo, dpo) plus the
     weighted total; an off channel gets a PNG that says it was off and why, so a missing curve is
     never mistaken for a flat one. :func:`plot_channels`: every channel in one PNG (the asset's
     metadata). matplotlib, Agg backend: no display needed.

Deliberately simplified: raw per-step values, no smoothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CHANNELS = ("grpo", "sdpo", "dpo", "total")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(losses: list[dict[str, Any]], channel: str) -> list[tuple[int, float]]:
    return [(r["step"], r[channel]) for r in losses if r.get(channel) is not None]


def plot_channels(losses: list[dict[str, Any]], out: Path) -> Path | None:
    """All per-channel loss curves in one PNG (one line per channel), or None without data."""
    series = {ch: pts for ch in CHANNELS if (pts := _series(losses, ch))}
    if not series:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=100)
    for name, pts in series.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return Path(out)


def plot_losses(
    losses: list[dict[str, Any]], out_dir: Path, *, off_reasons: dict[str, str] | None = None
) -> dict[str, Path]:
    plt = _pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    off_reasons = off_reasons or {}
    plots: dict[str, Path] = {}
    for ch in CHANNELS:
        pts = _series(losses, ch)
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
