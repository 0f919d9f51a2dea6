"""The driver at the scale of a large cluster: 1,000 and 4,000 simulated ranks against the real
log channel, console and rank 0's rendezvous store (tests/support/sim_ranks.py), and the collection
of 10,000 ensemble members through ``collection.decode``.

For each world size: seconds until every rank has connected to the driver's channel and passed the
store's rendezvous, lines streamed and shown (none may be lost), the driver process's memory growth
and CPU seconds. Ranks stream ``--lines-per-s`` lines for ``--seconds``: rank 0 only (the runner's
default ``log_ranks="0"``) and every rank (``log_ranks="all"``).

    python benchmarks/bench_scale.py [--worlds 250,1000,4000] [--lines-per-s 100] [--seconds 5]
        [--members 10000]
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def members(n: int) -> dict:
    """``n`` fitted decision trees (an ensemble's members) through the executors' encoding and the
    driver's ``collection.decode``: seconds, MiB of chunk rows, the driver's memory growth."""
    import numpy as np
    import pyarrow as pa
    from sklearn.tree import DecisionTreeClassifier

    from sparkml_dist import collection
    from tests.support.sim_ranks import _rss_mib

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(500, 8)), rng.integers(0, 2, 500)
    trees = [DecisionTreeClassifier(max_depth=6, random_state=i).fit(X, y) for i in range(50)]
    batches = [collection.encode(g, 0, trees[g % 50]) for g in range(n)]  # executors' side
    table = pa.Table.from_batches(batches)
    rss0, t0 = _rss_mib(), time.perf_counter()
    got = collection.decode(table, range(n))
    seconds = time.perf_counter() - t0
    assert len(got) == n and all(type(m).__name__ == "DecisionTreeClassifier" for m in got.values())
    return {
        "members": n,
        "decode_s": seconds,
        "table_mib": table.nbytes / 2**20,
        "pickle_kib_each": len(pickle.dumps(trees[0])) / 1024,
        "rss_growth_mib": _rss_mib() - rss0,
    }


def figure(rows, args) -> None:
    import figures

    def panel(title, ylabel, log_ranks, key):
        bars = {f"{o['world']:,} ranks": round(o[key], 2) for lr, o in rows if lr == log_ranks}
        return {"title": title, "ylabel": ylabel, "bars": bars}

    panels = [
        panel("slowest rank past the rendezvous (log_ranks=0)", "seconds", "0", "rendezvous_s"),
        panel("driver memory growth (log_ranks=all)", "MiB", "all", "rss_growth_mib"),
        panel(
            f"lines shown per s, {args.lines_per_s:g}/s per rank (log_ranks=all)",
            "lines/s",
            "all",
            "lines_per_s",
        ),
    ]
    command = "python benchmarks/bench_scale.py " + " ".join(sys.argv[1:])
    figures.save(args.figure, "bars", {"panels": panels}, command)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", default="250,1000,4000")
    ap.add_argument("--lines-per-s", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--members", type=int, default=10000)
    ap.add_argument("--figure", default=None)
    args = ap.parse_args()
    from tests.support.sim_ranks import simulate

    rows = []
    for world in [int(w) for w in args.worlds.split(",")]:
        for log_ranks in ("0", "all"):
            out = simulate(
                world,
                lines_per_s=args.lines_per_s,
                seconds=args.seconds,
                log_ranks=log_ranks,
                procs=args.procs,
            )
            rows.append((log_ranks, out))
            print(
                f"{world:5d} ranks, log_ranks={log_ranks:3s}: connected {out['connected_s']:6.2f} s, "
                f"rendezvous {out['rendezvous_s']:6.2f} s, "
                f"lines {out['lines_shown']:,}/{out['lines_sent']:,} shown ({out['lines_per_s']:,.0f}/s), "
                f"errors {out['errors']}, driver +{out['rss_growth_mib']:.0f} MiB "
                f"{out['cpu_s']:.1f} CPU s {out['first_errors']}",
                flush=True,
            )
    print(
        f"\nsimulated ranks ({args.procs} client processes, 8 ranks per loopback address, 16 from "
        f"4,000), {args.lines_per_s:g} lines/s per streaming rank for {args.seconds:g} s, this 2-core machine"
    )
    head = ("ranks", "log_ranks", "connected s", "rendezvous s", "lines sent", "not shown (counted)",
            "shown/s", "errors", "driver MiB", "driver CPU s")  # fmt: skip
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for log_ranks, o in rows:
        print(
            f"| {o['world']:,} | {log_ranks} | {o['connected_s']:.2f} | {o['rendezvous_s']:.2f} | "
            f"{o['lines_sent']:,} | {o['lost_lines']:,} ({o['dropped']:,}) | {o['lines_per_s']:,.0f} | "
            f"{o['errors']} | {o['rss_growth_mib']:.0f} | {o['cpu_s']:.1f} |"
        )
    if args.figure:
        figure(rows, args)
    if args.members:
        m = members(args.members)
        print(
            f"\ncollection: {m['members']:,} members ({m['pickle_kib_each']:.1f} KiB each pickled, "
            f"{m['table_mib']:.0f} MiB of chunk rows) decoded in {m['decode_s']:.2f} s, "
            f"driver +{m['rss_growth_mib']:.0f} MiB"
        )


if __name__ == "__main__":
    main()
