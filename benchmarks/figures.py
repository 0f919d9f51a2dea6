"""The README's figures: drawn from a benchmark's series, saved as PNG with the series beside them.

``save(path, kind, data, command)`` writes ``path`` (PNG, small) and ``path`` with ``.json`` (the
series and the command that measured them); the PNG's metadata records what the figure shows
(:func:`signature`: titles, axis labels, series names), so a test redraws the figure from the JSON
and checks it shows the same series on the same axes as the stored PNG.

``python benchmarks/figures.py docs/figures/X.png`` redraws a figure from its stored series.

Kinds: ``frontier`` (fit seconds vs test AUC, one point per contender), ``bars`` (panels of
named bars) and ``rank_times`` (a run's per-rank seconds a step, as ``last_run().plot()`` draws them).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict


def _frontier(data: Dict[str, Any]):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for p in data["points"]:
        ax.scatter(p["fit_s"], p["auc"], s=50, label=f"{p['name']}: {p['fit_s']:.1f} s, AUC {p['auc']:.4f}")
    ax.margins(x=0.25, y=0.35)
    ax.set_xlabel("fit seconds (fastest of the rounds, local[2]); up and left is better")
    ax.set_ylabel("test AUC")
    ax.set_title(data.get("title", "time vs accuracy"), fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, frameon=False)
    fig.tight_layout()
    return fig


def _bars(data: Dict[str, Any]):
    import matplotlib.pyplot as plt

    panels = data["panels"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    for ax, panel in zip(axes if len(panels) > 1 else [axes], panels):
        names, values = list(panel["bars"]), list(panel["bars"].values())
        ax.bar(names, values, color=["#5a7"] + ["#9ab"] * (len(names) - 1), label=names)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_title(panel["title"], fontsize=9)
        ax.set_ylabel(panel["ylabel"])
        ax.tick_params(axis="x", labelrotation=20, labelsize=7)
    fig.tight_layout()
    return fig


def _rank_times(data: Dict[str, Any]):
    """A run's per-rank step times as ``sparkml_dist.runner.last_run().plot()`` draws them."""
    from sparkml_dist.runner.timing.report import RunReport

    ax = RunReport(data["rows"]).plot()
    ax.set_title(data.get("title", "seconds a step, by rank"), fontsize=10)
    ax.figure.tight_layout()
    return ax.figure


KINDS = {"frontier": _frontier, "bars": _bars, "rank_times": _rank_times}


def draw(kind: str, data: Dict[str, Any]):
    import matplotlib

    matplotlib.use("Agg")
    return KINDS[kind](data)


def signature(fig) -> list:
    """What a figure shows, axis by axis: title, x and y labels, the series' names."""
    out = []
    for ax in fig.axes:
        handles, labels = ax.get_legend_handles_labels()
        out.append([ax.get_title(), ax.get_xlabel(), ax.get_ylabel(), sorted(labels)])
    return out


def redraw(path: str) -> None:
    """Draw ``path`` again from the series stored beside it (the same command recorded)."""
    with open(os.path.splitext(path)[0] + ".json") as fh:
        stored = json.load(fh)
    save(path, stored["kind"], stored["data"], stored["command"])


def save(path: str, kind: str, data: Dict[str, Any], command: str) -> None:
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig = draw(kind, data)
    meta = {"Description": json.dumps(signature(fig)), "Software": command}
    fig.savefig(path, dpi=80, metadata=meta)
    plt.close(fig)
    with open(os.path.splitext(path)[0] + ".json", "w") as fh:
        json.dump({"kind": kind, "command": command, "data": data}, fh, indent=1, sort_keys=True)
    print("wrote", path, f"({os.path.getsize(path) / 1024:.0f} KiB) and its series")


if __name__ == "__main__":
    import sys

    for p in sys.argv[1:]:  # python benchmarks/figures.py docs/figures/ensemble_frontier.png
        redraw(p)
