"""DDP's and Horovod's communication settings and DiLoCo across hosts joined by Ethernet-like
links: what each costs or saves against plain DDP, 2 ranks (gloo), one per host.

The hosts are network namespaces on this machine (tests/support/hosts.py: needs root), a Spark
standalone worker of one core in each, the ranks launched by ``BarrierRunner(2)`` one per host;
each ``--links`` entry shapes both hosts' links (``tc`` token bucket, both directions) to that
rate (``1gbit``, ``10gbit``) or leaves them unshaped (``unshaped``: the veth's ~45 Gbit/s).
``--links loopback`` runs 2 local rank processes instead (no root needed).

Every contender trains the same MLP (``--hidden`` wide: its gradients are large against the
compute) on the same synthetic classification task for the same number of samples (fixed global
batch), and reports samples/s after a warm-up, the loss over its last steps, and the bytes it
handed to collectives per sample, measured (:func:`sparkml_dist.parallel.traffic.meter` counts
every tensor a rank gives torch.distributed or Horovod during the timed steps, by dtype):

- ``ddp``: ``comm.ddp(model)`` (DDP's defaults: 25 MiB buckets, float32 all-reduce);
- ``bucket1`` / ``bucket100``: ``bucket_cap_mb=1`` / ``100``;
- ``accumulate4``: ``accumulate=4``, micro-batches of a quarter (one all-reduce per 4);
- ``fp16`` / ``powersgd4``: the compression hooks (PowerSGD rank 4, after 2 plain steps);
- ``diloco8``: no DDP; ``DiLoCo(sync_every=8)`` after each inner SGD step (``dilocoH``: any H);
- ``hvd`` / ``hvd_fusion1`` / ``hvd_fp16``: Horovod's ``DistributedOptimizer`` through
  ``comm.horovod`` with ``BarrierRunner(backend="horovod", comm=...)``: its defaults, a 1 MiB
  fusion threshold (``bucket_cap_mb=1``), fp16 compression (needs Horovod: ``make horovod``).

Contenders interleave, the order alternating each round, on every link in turn.

    python benchmarks/bench_comm.py [--links unshaped,10gbit,1gbit] [--hidden 4096] [--steps 30]
        [--repeats 2] [--settings ddp,...] [--figure docs/figures/comm_links.png]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from harness import interleaved  # noqa: E402

FEATURES, CLASSES, BATCH = 512, 10, 128  # global batch: 64 rows per rank


def train(setting, hidden, steps, warmup=5):
    """One rank's run of ``setting``: samples/s (global), last loss, bytes it handed to collectives
    per sample and their dtypes (measured)."""
    import torch
    import torch.distributed as dist

    from sparkml_dist.parallel import comm, traffic
    from sparkml_dist.parallel.diloco import DiLoCo
    from sparkml_dist.runner import context, init_process_group

    torch.set_num_threads(1)
    if setting.startswith("hvd"):  # Horovod starts with the run's comm= settings (HOROVOD_*)
        import horovod.torch as hvd

        hvd.init()
        rank, world = hvd.rank(), hvd.size()

        def barrier():  # Horovod matches collectives by name: the same on every rank
            hvd.allreduce(torch.zeros(1), name="bench_barrier")
    else:
        init_process_group()
        rank, world = context().rank, context().world_size
        barrier = dist.barrier
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(), torch.nn.Linear(hidden, CLASSES),
    )  # fmt: skip
    params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(1 + rank)
    teacher = torch.Generator().manual_seed(99)
    W = torch.randn(FEATURES, CLASSES, generator=teacher)
    accumulate = 4 if setting == "accumulate4" else 1
    options = {
        "ddp": {},
        "bucket1": {"bucket_cap_mb": 1},
        "bucket100": {"bucket_cap_mb": 100},
        "accumulate4": {"accumulate": 4},
        "fp16": {"compression": "fp16"},
        "powersgd4": {"compression": "powersgd", "powersgd_rank": 4},
    }
    outer = None
    if setting.startswith("hvd"):
        net = model
    elif setting.startswith("diloco"):
        net = model
        outer = DiLoCo(model, sync_every=int(setting[len("diloco") :]))
    else:
        net = comm.ddp(model, **options[setting])
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9 if outer is None else 0.0)
    if setting.startswith("hvd"):
        import horovod.torch as hvd

        opt = comm.horovod(opt, model)  # the run's comm= settings
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    per_rank = BATCH // world
    losses, started = [], None
    metered = contextlib.ExitStack()
    for step in range(warmup + steps):
        if step == warmup:
            barrier()
            started, wire, resent = time.perf_counter(), wire_bytes(), retransmits()
            sent = metered.enter_context(traffic.meter())  # what the timed steps hand to collectives
        x = torch.randn(per_rank, FEATURES, generator=g)
        y = (x @ W).argmax(1)
        micro = per_rank // accumulate
        for m in range(accumulate):
            xb, yb = x[m * micro : (m + 1) * micro], y[m * micro : (m + 1) * micro]
            ctx = net.micro_step() if accumulate > 1 else _null()
            with ctx:
                loss = torch.nn.functional.cross_entropy(net(xb), yb) / accumulate
                loss.backward()
        opt.step()
        opt.zero_grad()
        if outer is not None:
            outer.step()
        losses.append(loss.item() * accumulate)
    metered.close()
    wire, resent = wire_bytes() - wire, retransmits() - resent  # before the barrier: not the steps'
    barrier()
    wall = time.perf_counter() - started
    samples = steps * BATCH
    return {
        "samples_per_s": samples / wall,
        "loss": sum(losses[-5:]) / 5,
        "bytes_per_sample": sent.bytes / samples,  # measured: every tensor handed to a collective
        "wire_bytes_per_sample": wire / samples,  # measured: what this host's links sent (not loopback's)
        "retransmits_per_step": resent / steps,  # TCP segments this host sent again (lost on a full queue)
        "dtypes": sorted(sent.by_dtype),
        "params": params,
    }


def wire_bytes() -> int:
    """Bytes this network namespace's interfaces have sent, loopback left out (``/proc/net/dev``
    is the namespace's: on the several-hosts cluster, one host's link; TCP/IP headers included)."""
    total = 0
    with open("/proc/net/dev") as fh:
        for line in fh.readlines()[2:]:
            name, _, fields = line.partition(":")
            if name.strip() != "lo":
                total += int(fields.split()[8])  # transmit bytes
    return total


def retransmits() -> int:
    """TCP segments this network namespace has sent again (``/proc/net/snmp``: RetransSegs)."""
    with open("/proc/net/snmp") as fh:
        rows = [line.split() for line in fh if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("RetransSegs")])


class _null:
    def __enter__(self):
        return True

    def __exit__(self, *exc):
        return False


SETTINGS = ("ddp", "bucket1", "bucket100", "accumulate4", "fp16", "powersgd4", "diloco8")
HOROVOD = {"hvd": {}, "hvd_fusion1": {"bucket_cap_mb": 1}, "hvd_fp16": {"compression": "fp16"}}


def contenders(settings, np, args):
    from sparkml_dist.runner import BarrierRunner

    def one(s):
        options = dict(log_ranks="none", timeout=1200, collective_timeout=300)
        if s in HOROVOD:
            options.update(backend="horovod", comm=HOROVOD[s])
        return lambda: BarrierRunner(np, **options).run(train, s, args.hidden, args.steps)

    return {s: one(s) for s in settings}


def on_hosts(links, settings, args):
    """{link: {setting: result}}: the cluster built once, each link shaped in turn."""
    sys.path.insert(0, os.path.dirname(HERE))
    from harness import hosts_session

    from tests.support.hosts import Hosts, unavailable

    why = unavailable()
    if why:
        raise SystemExit(f"shaped links need network-namespace hosts: {why} (use --links loopback)")
    out = {}
    with Hosts(cores=1, memory="3g") as cluster:
        spark = hosts_session(cluster, "bench_comm")
        try:
            for link in links:
                for h in ("host1", "host2"):
                    cluster.unshape(h) if link == "unshaped" else cluster.shape(h, link)
                measured = cluster.throughput("host1", "host2", seconds=1.0)
                print(f"== link {link}: one TCP stream carries {measured / 1e9:.2f} Gbit/s", flush=True)
                _, out[link] = interleaved(contenders(settings, 2, args), args.repeats)
                out[link]["_measured_gbit"] = measured / 1e9
        finally:
            spark.stop()
    return out


def report(link, last, settings, args):
    base = last["ddp"]
    print(
        f"\n{link}, 2 ranks (gloo){' on 2 hosts' if link != 'loopback' else ''}, MLP "
        f"{FEATURES}-{args.hidden}-{args.hidden}-{CLASSES} ({base['params'] / 1e6:.1f} M parameters), "
        f"global batch {BATCH}, {args.steps} timed steps, last of {args.repeats} interleaved rounds"
    )
    head = ("setting", "samples/s", "vs ddp", "loss", "bytes/sample", "vs ddp", "sent as")
    print("  {:12s} {:>10s} {:>7s} {:>7s} {:>13s} {:>7s}  {}".format(*head))
    for s in settings:
        r = last[s]
        speed = r["samples_per_s"] / base["samples_per_s"]
        moved = r["bytes_per_sample"] / base["bytes_per_sample"]
        print(
            f"  {s:12s} {r['samples_per_s']:10.0f} {speed:6.2f}x {r['loss']:7.3f} "
            f"{r['bytes_per_sample']:13,.0f} {moved:6.3f}x  {'+'.join(r.get('dtypes', []))}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--links", default="unshaped,10gbit,1gbit")
    ap.add_argument("--settings", default=",".join(SETTINGS + tuple(HOROVOD)))
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--figure", default=None)
    args = ap.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [HERE, os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]
    )
    links = args.links.split(",")
    settings = args.settings.split(",")
    if "ddp" not in settings:
        raise SystemExit("--settings must include ddp (the baseline)")
    if links == ["loopback"]:
        _, last = interleaved(contenders(settings, -2, args), args.repeats)
        results = {"loopback": last}
    else:
        results = on_hosts(links, settings, args)
    for link, last in results.items():
        report(link, last, settings, args)
    if args.figure:
        figure(results, settings, args)


def figure(results, settings, args):
    import figures

    panels = [
        {
            "title": f"{link} ({r['_measured_gbit']:.2f} Gbit/s measured)" if "_measured_gbit" in r else link,
            "ylabel": "samples/s vs plain DDP",
            "bars": {s: round(r[s]["samples_per_s"] / r["ddp"]["samples_per_s"], 3) for s in settings},
        }
        for link, r in results.items()
    ]
    slowest = list(results)[-1]
    panels.append(
        {
            "title": f"loss after the same samples ({slowest})",
            "ylabel": "loss (lower is better)",
            "bars": {s: round(results[slowest][s]["loss"], 4) for s in settings},
        }
    )
    command = "python benchmarks/bench_comm.py " + " ".join(sys.argv[1:])
    figures.save(args.figure, "bars", {"panels": panels}, command)


if __name__ == "__main__":
    main()
