"""The loss-curve figure of a training run (PNG, matplotlib Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from kvcert.atomic import atomic_path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_loss_curve(history: Sequence[dict[str, Any]], phase_ends: Sequence[int], path: str | Path,
                    title: str = "embedded model training") -> Path:
    """Response, auxiliary, retrieval, readout, entity and question-time attention loss
    per step (smoothed), phase boundaries dashed."""
    path = Path(path)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    steps = [h["step"] for h in history]
    for key, label in (("answer_loss", "response tokens"), ("aux_loss", "copy / context tokens"),
                       ("retrieval_loss", "retrieval attention"),
                       ("readout_loss", "retrieval head readout"),
                       ("entity_loss", "entity attention"),
                       ("question_loss", "question-time attention")):
        points = [(s, h[key]) for s, h in zip(steps, history) if h.get(key) is not None]
        if not points:
            continue
        xs, ys = zip(*points)
        ax.plot(xs, ys, alpha=0.25, linewidth=0.8)
        ax.plot(xs, _smooth(ys), label=label, color=ax.lines[-1].get_color())
    for end in phase_ends[:-1]:
        ax.axvline(end, linestyle="--", color="gray", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats): cross-entropy; KL for question-time attention")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp)
    plt.close(fig)
    return path


def _smooth(values: Sequence[float], window: int = 25) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out
