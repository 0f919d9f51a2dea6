"""Reduction servers against the ring: 4 workers' DDP with ``comm={"reduction_servers": k}`` beside
plain DDP (gloo's ring all-reduce), each rank and each server a host of its own, links shaped.

The hosts are network namespaces on this machine (tests/support/hosts.py: needs root): one Spark
standalone worker of one core on each of ``4 + max(k)`` hosts, the driver in its own. Every
contender trains ``bench_comm.train``'s MLP (``--hidden 4096``: 18.9 M parameters, 75.6 MB of
float32 gradients a step) on the same synthetic task for the same samples (global batch 128, 32
rows a worker) and reports samples/s after a warm-up, the loss over its last steps, and the bytes
each worker's host sent on its link per sample, measured on the link (``/proc/net/dev`` of the
worker's namespace: TCP/IP headers and Spark's own traffic included).

- ``ddp``: ``BarrierRunner(4)``, ``comm.ddp(model)``: DDP's 25 MiB buckets, gloo's ring;
- ``servers<k>``: ``BarrierRunner(4, comm={"reduction_servers": k})``: the same program, each
  bucket cut into k shards summed on k CPU servers (:mod:`sparkml_dist.runner.backends.reducers`);
- ``--compression none,fp16``: each of them also with ``comm={"compression": "fp16"}`` (``ddp-fp16``:
  DDP's fp16 hook, the ring in half precision; ``servers<k>-fp16``: half-precision shards and sums,
  added in float32 on the servers).

Contenders interleave, the order alternating each round, on every link in turn. Each host has one
core of this 2-core machine's, so the 4 workers' compute is slower than on a cluster's hosts: the
links are what the comparison is about.

    python benchmarks/bench_servers.py [--links 1gbit,10gbit] [--servers 2,4] [--steps 20] [--repeats 2]
        [--compression none,fp16] [--only servers4,servers4-fp16]
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_comm import BATCH, FEATURES, train  # noqa: E402
from harness import hosts_session, interleaved  # noqa: E402

WORKERS = 4


def contenders(servers, args):
    from sparkml_dist.runner import BarrierRunner

    def one(k, compression):
        comm = {n: v for n, v in (("reduction_servers", k), ("compression", compression)) if v} or None
        options = dict(log_ranks="none", timeout=1800, collective_timeout=600, comm=comm)

        def run():
            out = BarrierRunner(WORKERS, **options).run(train, "ddp", args.hidden, args.steps, 3)
            return {**out, **_step_times()}

        return run

    chosen = {}
    for compression in _compressions(args):
        tail = f"-{compression}" if compression else ""
        chosen[f"ddp{tail}"] = one(0, compression)
        chosen.update({f"servers{k}{tail}": one(k, compression) for k in servers})
    kept = {k: v for k, v in chosen.items() if not args.only or k in args.only.split(",")}
    return kept | {"ddp": one(0, None)}


def _compressions(args):
    return [None if c == "none" else c for c in args.compression.split(",")]


def _step_times():
    """The workers' median compute and communication wait a step, from the run's step clock."""
    import statistics

    from sparkml_dist.runner.timing.report import last_run

    rows = [r for r in last_run().rows if r["steps"]]
    return {k: statistics.median(r[k] / r["steps"] for r in rows) for k in ("step_s", "compute_s", "comm_s")}


def cluster_of(hosts: int):
    from tests.support.hosts import Hosts

    class Cluster(Hosts):
        names = ("driver",) + tuple(f"host{i}" for i in range(1, hosts + 1))

        def __enter__(self):
            super().__enter__()  # the master on host1, workers on host1 and host2
            for name in self.names[3:]:
                self.start_worker(name)
            return self

    return Cluster(cores=1, memory="2g")


def on_hosts(links, servers, args):
    from tests.support.hosts import unavailable

    why = unavailable()
    if why:
        raise SystemExit(f"shaped links need network-namespace hosts: {why}")
    hosts = WORKERS + max(servers)
    out = {}
    with cluster_of(hosts) as cluster:
        spark = hosts_session(cluster, "bench_servers", executors=hosts)
        try:
            _wait_for_executors(spark, hosts)
            for link in links:
                for h in cluster.names[1:]:
                    cluster.unshape(h) if link == "unshaped" else cluster.shape(h, link)
                measured = cluster.throughput("host1", "host2", seconds=1.0)
                print(f"== link {link}: one TCP stream carries {measured / 1e9:.2f} Gbit/s", flush=True)
                _, out[link] = interleaved(contenders(servers, args), args.repeats)
                out[link]["_measured_gbit"] = measured / 1e9
        finally:
            spark.stop()
    return out


def _wait_for_executors(spark, n, within=300.0):
    import time

    end = time.monotonic() + within
    tracker = spark.sparkContext.statusTracker()
    while len(tracker.getExecutorInfos()) - 1 < n:  # the driver is listed too
        if time.monotonic() > end:
            raise SystemExit(f"only {len(tracker.getExecutorInfos()) - 1} of {n} executors came up")
        time.sleep(1.0)


def report(link, last, servers, args):
    base = last["ddp"]
    print(
        f"\n{link} ({last['_measured_gbit']:.2f} Gbit/s measured), {WORKERS} workers, MLP {FEATURES}-"
        f"{args.hidden}-{args.hidden}-10 ({base['params'] / 1e6:.1f} M parameters), global batch {BATCH}, "
        f"{args.steps} timed steps, last of {args.repeats} interleaved rounds"
    )
    head = ("contender", "samples/s", "vs ddp", "loss", "wire B/sample", "vs ddp", "resent/step")
    head += ("compute/comm s",)
    print("  {:10s} {:>10s} {:>7s} {:>8s} {:>14s} {:>7s} {:>12s} {:>15s}".format(*head))
    for name in ["ddp"] + [n for n in last if n not in ("ddp", "_measured_gbit")]:
        r = last[name]
        print(
            f"  {name:10s} {r['samples_per_s']:10.1f} {r['samples_per_s'] / base['samples_per_s']:6.2f}x "
            f"{r['loss']:8.4f} {r['wire_bytes_per_sample']:14,.0f} "
            f"{r['wire_bytes_per_sample'] / base['wire_bytes_per_sample']:6.3f}x "
            f"{r['retransmits_per_step']:12.1f} {r['compute_s']:7.3f}/{r['comm_s']:.3f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--links", default="1gbit,10gbit")
    ap.add_argument("--servers", default="2,4")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--compression", default="none", help="none,fp16: each contender with each of them")
    ap.add_argument("--only", default="", help="contenders to run beside ddp (default: all)")
    args = ap.parse_args()
    paths = [HERE, os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    servers = [int(k) for k in args.servers.split(",")]
    results = on_hosts(args.links.split(","), servers, args)
    for link, last in results.items():
        report(link, last, servers, args)


if __name__ == "__main__":
    main()
