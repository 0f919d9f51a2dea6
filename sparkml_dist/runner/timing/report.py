"""The driver's view of each rank's time: a straggler named while the run goes on, a report after.  [driver]

Each rank's step clock (:mod:`.clock`) sends its totals so far every couple of seconds; the
driver's :class:`Board` keeps each rank's latest totals and the *windows* between two of its
summaries (steps, and seconds per step split into data wait, compute and communication).

**A straggler, named while it runs.**  In synchronous training every rank takes as long a step as
the slowest: the others spend the difference waiting in the collectives.  So a rank is judged by
its *own work* a step (data wait and compute: the step less its communication).  Once every rank
has sent a window, a rank whose own work a step is at least :data:`SLOW` (1.3) times the median of
the other ranks' (and more than theirs by a tenth of a step and by :data:`NOISE_S`: 10 ms, two of a
scheduler's time slices on a shared host), in :data:`WINDOWS` (3) of its
windows in a row, is named once on the console, with its host and where its excess goes::

    [sparkml_dist] rank 1 on 10.0.0.12 is slow: its own work takes 0.055 s a step against
    0.008 s for the others; compute 6.9x the others'; the other ranks wait for it in all-reduce

and once more when it has been back under :data:`RECOVERED` (1.15) times the median for as many
windows.  A run too short for that still ends with the report's straggler line, when the run as a
whole had one (:attr:`RunReport.straggler`); a run without one says nothing.

**The report** (:class:`RunReport`, :func:`last_run`): ``ranks``, a pandas DataFrame of one row
per rank (``rank``, ``host``, ``steps``, ``step_s``, ``data_s``, ``compute_s``, ``comm_s``: totals
in seconds), ``slowest`` (the rank with the most seconds per step; None without steps or without a
rank 10% slower than the median), ``advice`` (what to change, by where the time goes), ``line``
(one line for the console) and :meth:`RunReport.plot`.

Example::

    BarrierRunner(2).run_with_data(df, train)
    report = last_run()
    report.ranks, report.slowest, report.advice
    report.plot()                      # a figure of the same (matplotlib)
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

SLOW = 1.3  # a rank this much slower per step than the others' median ...
WINDOWS = 3  # ... in this many of its summaries in a row is named as slow
RECOVERED = 1.15  # ... and as recovered once under this for as many
REPORTED = 1.1  # the report's slowest rank: at least this much slower than the median
NOISE_S = 0.010  # an excess a step below this is a loaded host's scheduling, not a slow rank
DATA_SHARE = 0.25  # data wait past this share of a step: the data path is the bottleneck
COMM_SHARE = 0.3  # communication past this share of a step: the links are

_LAST: Optional["RunReport"] = None
_LOCK = threading.Lock()


@dataclass
class _Rank:
    totals: Dict[str, float] = field(default_factory=dict)
    window: Optional[Dict[str, float]] = None  # per step, between its last two summaries
    slow_in_a_row: int = 0
    fast_in_a_row: int = 0
    named: bool = False


def _per_step(now: Dict[str, float], before: Dict[str, float]) -> Optional[Dict[str, float]]:
    steps = now.get("steps", 0) - before.get("steps", 0)
    if steps <= 0:
        return None
    out = {k: (now.get(k, 0.0) - before.get(k, 0.0)) / steps for k in ("step_s", "data_s", "comm_s")}
    out["compute_s"] = max(0.0, out["step_s"] - out["data_s"] - out["comm_s"])
    return out


class Board:
    """Every rank's step totals in one attempt, fed by the channel (:meth:`add`); ``say`` prints a
    line on the console; ``hosts`` maps a rank to the address it reached the rendezvous from."""

    def __init__(self, world: int, say: Callable[[str], Any], hosts: Dict[int, str]) -> None:
        self.world, self.say, self.hosts = world, say, hosts
        self.ranks: Dict[int, _Rank] = {}
        self.named = False  # a rank was named slow while the run went on
        self._lock = threading.Lock()

    def add(self, rank: Any, message: Dict[str, Any]) -> None:
        """A rank's summary (``protocol.FRAME_TIMING``): its totals so far."""
        if not isinstance(rank, int) or not 0 <= rank < self.world:
            return
        totals = {}
        for key in ("steps", "step_s", "data_s", "comm_s"):
            value = message.get(key)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                return  # a malformed summary is dropped, never trusted
            totals[key] = float(value)
        with self._lock:
            r = self.ranks.setdefault(rank, _Rank())
            window = _per_step(totals, r.totals)
            r.totals = totals
            if window is not None:
                r.window = window
                self._judge(rank)

    def _host(self, rank: int) -> str:
        return self.hosts.get(rank, "?")

    def _judge(self, rank: int) -> None:
        """(under the lock) Name ``rank`` slow, or recovered, by its latest window."""
        others = [r.window for k, r in self.ranks.items() if k != rank and r.window]
        if len(others) < self.world - 1 or not others:
            return
        me = self.ranks[rank]
        mine, median = _own(me.window), statistics.median(_own(w) for w in others)
        step = statistics.median(w["step_s"] for w in others)
        slow = _slower(mine, median, step, SLOW)
        me.slow_in_a_row = me.slow_in_a_row + 1 if slow else 0
        me.fast_in_a_row = me.fast_in_a_row + 1 if not _slower(mine, median, step, RECOVERED) else 0
        if not me.named and me.slow_in_a_row >= WINDOWS:
            me.named = self.named = True
            self.say(
                f"[sparkml_dist] rank {rank} on {self._host(rank)} is slow: its own work takes {mine:.3f} s "
                f"a step against {median:.3f} s for the others; {_where(me.window, others)}\n"
            )
        elif me.named and me.fast_in_a_row >= WINDOWS:
            me.named = False
            self.say(
                f"[sparkml_dist] rank {rank} on {self._host(rank)} is no longer slow: its own work "
                f"takes {mine:.3f} s a step, the others' {median:.3f} s\n"
            )

    def report(self) -> "RunReport":
        with self._lock:
            rows = []
            for rank in range(self.world):
                t = self.ranks.get(rank, _Rank()).totals
                step, data, comm = t.get("step_s", 0.0), t.get("data_s", 0.0), t.get("comm_s", 0.0)
                rows.append(
                    {
                        "rank": rank,
                        "host": self._host(rank),
                        "steps": int(t.get("steps", 0)),
                        "step_s": step,
                        "data_s": min(data, step),
                        "compute_s": max(0.0, step - data - comm),
                        "comm_s": min(comm, step),
                    }
                )
        return RunReport(rows)


def _own(per_step: Dict[str, float]) -> float:
    """A rank's own work a step: its step less the time it waited on its peers."""
    return per_step["data_s"] + per_step["compute_s"]


def _slower(mine: float, median: float, step: float, factor: float) -> bool:
    """``mine`` is ``factor`` times ``median`` or more, and more by a tenth of a ``step`` and by
    :data:`NOISE_S` (CI's loaded 2-core host named ranks of an undisturbed run at 0.011 s a step
    against 0.008 s, and at 0.022 s against 0.016 s)."""
    return mine >= factor * median and mine - median > max(0.1 * step, NOISE_S)


def _where(me: Dict[str, float], others: List[Dict[str, float]]) -> str:
    """Where a slow rank's excess goes, against the others' medians."""
    parts = []
    for key, name in (("compute_s", "compute"), ("data_s", "data wait"), ("comm_s", "communication")):
        median = statistics.median(o[key] for o in others)
        if me[key] - median > 0.1 * me["step_s"]:
            parts.append(
                f"{name} {me[key] / median:.1f}x the others'"
                if median > 0
                else f"{name} {me[key]:.3f} s a step"
            )
    said = "; ".join(parts) or "no one part of its step stands out"
    if statistics.median(o["comm_s"] for o in others) > me["comm_s"] + 0.1 * me["step_s"]:
        said += "; the other ranks wait for it in all-reduce"
    return said


class RunReport:
    """The last run's per-rank time (see the module docstring)."""

    def __init__(self, rows: List[Dict[str, Any]]) -> None:
        self.rows = rows

    @property
    def ranks(self):
        """One row per rank: ``rank, host, steps, step_s, data_s, compute_s, comm_s`` (totals, s)."""
        import pandas as pd

        return pd.DataFrame(
            self.rows, columns=["rank", "host", "steps", "step_s", "data_s", "compute_s", "comm_s"]
        )

    def _per_step(self) -> List[Dict[str, float]]:
        return [
            {k: r[k] / r["steps"] for k in ("step_s", "data_s", "compute_s", "comm_s")} | {"rank": r["rank"]}
            for r in self.rows
            if r["steps"] > 0
        ]

    @property
    def slowest(self) -> Optional[int]:
        """The rank with the most own work a step (data wait and compute), when it is at least
        :data:`REPORTED` times the other ranks' median and more by a tenth of a step; else None."""
        per = self._per_step()
        if len(per) < 2:
            return None
        worst = max(per, key=_own)
        others = [p for p in per if p is not worst]
        median = statistics.median(_own(p) for p in others)
        step = statistics.median(p["step_s"] for p in per)
        return int(worst["rank"]) if _slower(_own(worst), median, step, REPORTED) else None

    @property
    def advice(self) -> str:
        """What to change, by where the time goes."""
        per = self._per_step()
        if not per:
            return (
                "no steps were seen: mark the loop's steps with sparkml_dist.runner.step() to see "
                "where the time goes"
            )
        tips = []
        data = max(per, key=lambda p: p["data_s"] / p["step_s"] if p["step_s"] else 0)
        comm = max(per, key=lambda p: p["comm_s"] / p["step_s"] if p["step_s"] else 0)
        if data["step_s"] and data["data_s"] / data["step_s"] > DATA_SHARE:
            tips.append(
                f"rank {data['rank']} waits {data['data_s'] / data['step_s']:.0%} of each step for its data: "
                "read ahead more (shard().dataloader(read_ahead=..., num_workers=...)) or read the Parquet "
                "files in place (run_with_data on a plain scan) rather than a computed DataFrame"
            )
        slow = self.slowest
        if slow is not None:
            host = next(r["host"] for r in self.rows if r["rank"] == slow)
            tips.append(
                f"rank {slow} on {host} sets the pace: find what else runs on that host, leave the host out, "
                "or run the training under elastic.run so that losing it costs little"
            )
        if comm["step_s"] and comm["comm_s"] / comm["step_s"] > COMM_SHARE and slow is None:
            tips.append(
                f"communication is {comm['comm_s'] / comm['step_s']:.0%} of a step: on a slow link compress "
                "the gradients (BarrierRunner(comm={'compression': 'fp16'}), or 'powersgd'), accumulate "
                "(comm={'accumulate': 4}), or synchronise less often with DiLoCo "
                "(sparkml_dist.parallel.diloco); benchmarks/bench_comm.py measures each on your links"
            )
        return " ".join(tips) or "no rank stands out and no part of a step dominates"

    @property
    def seen(self) -> bool:
        """Whether any rank's steps were seen."""
        return any(r["steps"] for r in self.rows)

    @property
    def straggler(self) -> Optional[int]:
        """The rank the console names over the whole run: its own work a step :data:`SLOW` times
        the others' median and more by a tenth of a step (the rule applied while it runs)."""
        per = self._per_step()
        if len(per) < 2:
            return None
        worst = max(per, key=_own)
        median = statistics.median(_own(p) for p in per if p is not worst)
        step = statistics.median(p["step_s"] for p in per)
        return int(worst["rank"]) if _slower(_own(worst), median, step, SLOW) else None

    @property
    def line(self) -> str:
        """The report's straggler line for the console ("" when no rank is one)."""
        slow = self.straggler
        if slow is None:
            return ""
        row = next(r for r in self.rows if r["rank"] == slow)
        own = (row["data_s"] + row["compute_s"]) / row["steps"]
        others = [
            (r["data_s"] + r["compute_s"]) / r["steps"] for r in self.rows if r["rank"] != slow and r["steps"]
        ]
        return (
            f"[sparkml_dist] rank {slow} on {row['host']} was the slowest: its own work took {own:.3f} s a "
            f"step against {statistics.median(others):.3f} s for the others (runner.last_run())\n"
        )

    def table(self) -> str:
        """The per-rank table as text (what ``sparkml-dist run`` prints at the end)."""
        names = ("step_s", "data_s", "compute_s", "comm_s")
        lines = [f"{'rank':>4}  {'host':<15} {'steps':>6} " + " ".join(f"{n:>9}" for n in names)]
        for r in self.rows:
            figures = " ".join(f"{r[n]:>9.2f}" for n in names)
            lines.append(f"{r['rank']:>4}  {r['host']:<15} {r['steps']:>6} {figures}")
        return "\n".join(lines) + "\n"

    def metrics(self) -> Dict[str, float]:
        """Per-rank figures as MLflow metrics (``rank1_compute_s``, ...)."""
        out = {}
        for r in self.rows:
            for key in ("steps", "step_s", "data_s", "compute_s", "comm_s"):
                out[f"rank{r['rank']}_{key}"] = float(r[key])
        return out

    def plot(self, ax=None):
        """Each rank's seconds per step, stacked by data wait, compute and communication (matplotlib:
        ``pip install matplotlib``); the axes."""
        import matplotlib.pyplot as plt

        per = {p["rank"]: p for p in self._per_step()}
        ranks = [r["rank"] for r in self.rows]
        if ax is None:
            _, ax = plt.subplots(figsize=(max(5, 0.8 * len(ranks) + 3), 3.4))
        bottom = [0.0] * len(ranks)
        for key, name in (("data_s", "data wait"), ("compute_s", "compute"), ("comm_s", "communication")):
            values = [per.get(r, {}).get(key, 0.0) for r in ranks]
            ax.bar([str(r) for r in ranks], values, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_xlabel("rank")
        ax.set_ylabel("seconds a step")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        return ax


def remember(report: RunReport) -> None:
    global _LAST
    with _LOCK:
        _LAST = report


def last_run() -> Optional[RunReport]:
    """The report of the last run this process made (None before any): where each rank's time
    went, the slowest rank and what to change (see the module docstring)."""
    with _LOCK:
        return _LAST
