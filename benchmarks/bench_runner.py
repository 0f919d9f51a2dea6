"""BarrierRunner vs TorchDistributor vs plain torchrun (the floor), one SparkSession on local[2].

(a) wall time of a no-op job (init + one all-reduce): ours with warm ranks (forked from the
    executor's pool, the default after a session's first run) and cold (warm_ranks=False);
(b) samples/s of a fixed MLP trained with DDP (measured inside rank 0, after warm-up);
(c) a 1,000,000 x 50 float DataFrame (Parquet) into per-rank tensors: BarrierRunner.run_with_data +
    shard().to_torch() vs TorchDistributor's DataFrame loader; with the rank's peak memory growth.
    Ours twice: reading the Parquet files directly (the default for a plain scan) and with
    read_files=False (rows converted and shuffled by Spark, as for any other DataFrame).
(d) the cost of checkpointing the MLP every 100 (the default) and every 10 steps.
(e) Horovod: HorovodRunner (this runner, backend="horovod") vs horovod.spark.run (gloo), same
    functions: the wall time of a no-op job (hvd.init + one allreduce), and samples/s of the MLP
    trained with hvd.DistributedOptimizer (measured inside rank 0, after warm-up).
(f) ``--sections session``: a notebook's first runs.  Each round starts a new Python and
    SparkSession per contender and times ``--session-runs`` no-op runs back to back: warm ranks
    (the default: the first run starts the executor's pool and forks its ranks from it) and
    ``warm_ranks=False`` (every rank a new interpreter); rounds alternate which goes first.

Contenders are interleaved (the order rotates every round); the load average is recorded.

    python benchmarks/bench_runner.py [--repeats 3] [--rows 1000000] [--steps 1500]
                                      [--sections noop,mlp,data,ckpt,hvd_noop,hvd_mlp]
    python benchmarks/bench_runner.py --sections session [--repeats 3] [--session-runs 4]
    python benchmarks/bench_runner.py --gpu [--repeats 3] [--steps 300]   (see bench_gpu.py)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from harness import local_session  # noqa: E402


# ---------------------------------------------------------------- functions run on the ranks
def noop():
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def _mlp_problem(rank):
    """The benchmark MLP (seeded alike on every rank) and this rank's synthetic data."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = torch.nn.Sequential(
        torch.nn.Linear(50, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 2),
    )
    g = torch.Generator().manual_seed(rank)
    X = torch.randn(4096, 50, generator=g)
    return net, X, (X[:, 0] > 0).long(), g


def _timed_loop(model, opt, X, y, g, steps, batch, warmup, barrier, after_step=None):
    """Seconds for ``steps`` SGD steps after ``warmup`` untimed ones, between two barriers."""
    import time as _t

    import torch

    for i in range(warmup + steps):
        if i == warmup:
            barrier()
            t0 = _t.perf_counter()
        idx = torch.randint(0, 4096, (batch,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(X[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if after_step is not None and i >= warmup:
            after_step(i - warmup)
    barrier()
    return _t.perf_counter() - t0


def mlp_throughput(steps=300, batch=256, warmup=20, ckpt_every=0):
    """Samples/s of rank 0's DDP loop; with ``ckpt_every`` rank 0 also saves a checkpoint (model and
    optimizer state) every that many steps through sparkml_dist.runner.checkpoint."""
    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import checkpoint

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    net, X, y, g = _mlp_problem(dist.get_rank())
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def save(step):
        if ckpt_every and checkpoint.due(step, ckpt_every):
            checkpoint.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": step}, step)

    seconds = _timed_loop(model, opt, X, y, g, steps, batch, warmup, dist.barrier, save)
    return steps * batch * dist.get_world_size() / seconds


def hvd_noop():
    import horovod.torch as hvd
    import torch

    hvd.init()
    return hvd.allreduce(torch.ones(1), op=hvd.Sum, name="noop").item()


def hvd_mlp_throughput(steps=300, batch=256, warmup=20):
    """Samples/s of rank 0's loop: the MLP of (b) with hvd.DistributedOptimizer instead of DDP."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    net, X, y, g = _mlp_problem(hvd.rank())
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.01), named_parameters=net.named_parameters()
    )
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    seconds = _timed_loop(net, opt, X, y, g, steps, batch, warmup, hvd.barrier)
    return steps * batch * hvd.size() / seconds


def _status_mb(key: str) -> float:
    """A memory figure of this process from /proc/self/status (VmRSS: now, VmHWM: peak), in MiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _reset_peak():
    """Reset VmHWM (Linux >= 4.0) so the peak covers only what follows, not torch's import."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def import_torch():
    """The launch alone: what every contender pays before any data moves (ranks import torch)."""
    import torch

    return torch.__version__


def ours_load(cols):
    import torch  # noqa: F401 - imported before the baseline, as a training function would

    from sparkml_dist.runner import shard

    base = _status_mb("VmRSS")
    _reset_peak()
    s = shard()
    X = s.to_torch(cols)
    shard_mb = X.element_size() * X.nelement() / 2**20
    return {"rows": X.shape[0], "shard_mb": shard_mb, "peak_growth_mb": _status_mb("VmHWM") - base}


def td_load(cols, rows_per_rank):
    import numpy as np
    import torch
    from pyspark.ml.torch.distributor import _get_spark_partition_data_loader

    base = _status_mb("VmRSS")
    _reset_peak()
    loader = _get_spark_partition_data_loader(rows_per_rank, 10_000, num_workers=0)
    parts = [
        torch.stack([torch.as_tensor(np.asarray(c, dtype=np.float32)) for c in b], dim=1)
        if isinstance(b, (list, tuple))
        else b
        for b in loader
    ]
    X = torch.cat(parts)
    return {"rows": X.shape[0], "peak_growth_mb": _status_mb("VmHWM") - base}


# ---------------------------------------------------------------- driver
TORCHRUN_SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {here!r})
    from bench_runner import noop, mlp_throughput
    r = {fn}()
    import torch.distributed as dist
    if dist.get_rank() == 0:
        print("RESULT", r, flush=True)
    dist.destroy_process_group()
""")


def torchrun(fn: str, steps: int):
    script = os.path.join(tempfile.mkdtemp(), "job.py")
    call = "noop" if fn == "noop" else f"lambda: mlp_throughput({steps})"
    with open(script, "w") as fh:
        fh.write(TORCHRUN_SCRIPT.format(here=HERE, fn=f"({call})"))
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", script],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - t
    value = float(out.stdout.split("RESULT", 1)[1].split()[0])
    return wall, value


def main() -> None:
    if "--gpu" in sys.argv:  # ours vs torchrun on this machine's GPUs: no Spark JVM needed
        from bench_gpu import main as gpu_main

        return gpu_main([a for a in sys.argv[1:] if a != "--gpu"])
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--sections", default="noop,mlp,data,ckpt,hvd_noop,hvd_mlp")
    ap.add_argument("--job-limit", type=float, default=180.0, help="seconds before a hung job is cancelled")
    ap.add_argument("--figure", default=None, help="bar chart of the no-op and data sections (PNG + JSON)")
    ap.add_argument("--session-runs", type=int, default=4, help="no-op runs per new session (section f)")
    ap.add_argument("--session-child", choices=["warm", "cold"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.session_child:
        return session_child(args.session_child, args.session_runs)
    sections = [s for s in args.sections.split(",") if s]
    if "session" in sections:  # new sessions of their own, before this process starts one
        session_rounds(args.repeats, args.session_runs)
        sections.remove("session")
        if not sections:
            return

    from pyspark.ml.torch.distributor import TorchDistributor

    from sparkml_dist.runner import BarrierRunner

    spark = local_session("bench_runner")
    quiet = dict(log_ranks="none")

    def timed(fn):
        """(wall, value); a job past --job-limit has its Spark jobs cancelled and counts as hung (a
        peer's rank that aborts at exit leaves the other waiting forever: seen with TorchDistributor)."""
        done = threading.Event()

        def watch():
            if not done.wait(args.job_limit):
                print(f"  over {args.job_limit:.0f} s: cancelling its Spark jobs", flush=True)
                spark.sparkContext.cancelAllJobs()

        threading.Thread(target=watch, daemon=True).start()
        t = time.perf_counter()
        try:
            v = fn()
        except Exception as exc:  # noqa: BLE001 - cancelled, or the peer failed: reported, not timed
            return time.perf_counter() - t, HUNG + f" ({type(exc).__name__})"
        finally:
            done.set()
        return time.perf_counter() - t, v

    td = lambda: TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)  # noqa: E731
    noop_contenders = {
        "sparkml_dist": lambda: timed(lambda: BarrierRunner(2, **quiet).run(noop)),  # warm ranks
        "sparkml_dist_cold": lambda: timed(lambda: BarrierRunner(2, warm_ranks=False, **quiet).run(noop)),
        "torch_distributor": lambda: timed(lambda: td().run(noop)),
        "torchrun": lambda: torchrun("noop", args.steps),
    }
    mlp_contenders = {
        "sparkml_dist": lambda: timed(lambda: BarrierRunner(2, **quiet).run(mlp_throughput, args.steps)),
        "torch_distributor": lambda: timed(lambda: td().run(mlp_throughput, args.steps)),
        "torchrun": lambda: torchrun("mlp", args.steps),
    }
    ckpt_dir = tempfile.mkdtemp(prefix="bench_ckpt_")
    ckpt_contenders = {
        "no_checkpoint": lambda: timed(lambda: BarrierRunner(2, **quiet).run(mlp_throughput, args.steps)),
        "every_100_steps": lambda: timed(
            lambda: BarrierRunner(2, checkpoint_dir=ckpt_dir, **quiet).run(
                mlp_throughput, args.steps, ckpt_every=100
            )
        ),
        "every_10_steps": lambda: timed(
            lambda: BarrierRunner(2, checkpoint_dir=ckpt_dir, **quiet).run(
                mlp_throughput, args.steps, ckpt_every=10
            )
        ),
    }
    from sparkml_dist.horovod import HorovodRunner

    def horovod_spark_run(fn, *a):  # horovod's own launcher on the same session; rank 0's value
        import horovod.spark

        return horovod.spark.run(fn, args=a, num_proc=2, use_gloo=True, verbose=0)[0]

    hvd_noop_contenders = {
        "sparkml_dist": lambda: timed(lambda: HorovodRunner(np=2).run(hvd_noop)),
        "horovod_spark": lambda: timed(lambda: horovod_spark_run(hvd_noop)),
    }
    hvd_mlp_contenders = {
        "sparkml_dist": lambda: timed(lambda: HorovodRunner(np=2).run(hvd_mlp_throughput, steps=args.steps)),
        "horovod_spark": lambda: timed(lambda: horovod_spark_run(hvd_mlp_throughput, args.steps)),
    }
    cols = [f"c{i}" for i in range(50)]
    data_path = os.path.join(HERE, "data", f"floats_{args.rows}x50.parquet")
    if "data" in sections and not os.path.exists(data_path):
        os.makedirs(os.path.dirname(data_path), exist_ok=True)
        from pyspark.sql import functions as F

        spark.range(args.rows, numPartitions=8).select(
            *[(F.rand(i) * 2 - 1).alias(c) for i, c in enumerate(cols)]
        ).write.parquet(data_path)
    df = spark.read.parquet(data_path) if "data" in sections else None
    rows_per_rank = args.rows // 2
    data_contenders = {
        "sparkml_dist": lambda: timed(
            lambda: BarrierRunner(2, **quiet).run_with_data(df, ours_load, cols, return_all=True)
        ),
        "sparkml_dist_spark": lambda: timed(
            lambda: BarrierRunner(2, read_files=False, **quiet).run_with_data(
                df, ours_load, cols, return_all=True
            )
        ),
        "torch_distributor": lambda: timed(
            lambda: td()._train_on_dataframe(_td_all_ranks, df.repartition(2), cols, rows_per_rank)
        ),
        # the same launches without data: subtracted to give the feeding time alone
        "sparkml_dist_launch": lambda: timed(lambda: BarrierRunner(2, **quiet).run(import_torch)),
        "torch_distributor_launch": lambda: timed(lambda: td().run(import_torch)),
    }
    results = {s: {} for s in sections}
    all_contenders = {
        "noop": noop_contenders,
        "mlp": mlp_contenders,
        "data": data_contenders,
        "ckpt": ckpt_contenders,
        "hvd_noop": hvd_noop_contenders,
        "hvd_mlp": hvd_mlp_contenders,
    }
    for section in ("noop", "hvd_noop"):  # untimed warm-up: Python workers, page cache
        if section in sections:
            for fn in all_contenders[section].values():
                fn()
    for r in range(args.repeats):
        for section in sections:
            contenders = all_contenders[section]
            names = list(contenders)
            names = names[r % len(names) :] + names[: r % len(names)]
            for name in names:
                load = os.getloadavg()[0]
                wall, value = contenders[name]()
                if not (isinstance(value, str) and value.startswith(HUNG)):
                    results[section].setdefault(name, []).append((wall, value))
                print(
                    f"round {r} {section:5s} {name:18s} load {load:4.2f} wall {wall:7.2f}s  {value}",
                    flush=True,
                )

    med = lambda xs: statistics.median(xs)  # noqa: E731
    if "noop" in results:
        print(f"\n(a) no-op job (init + one all-reduce), median wall seconds over {args.repeats} rounds")
        noop_w = _nan_default({k: med([w for w, _ in v]) for k, v in results["noop"].items()})
        for k, w in noop_w.items():
            print(f"  {k:18s} {w:7.2f}s")
        print(
            f"  ours/torch_distributor {noop_w['sparkml_dist'] / noop_w['torch_distributor']:.3f}x, "
            f"ours/torchrun {noop_w['sparkml_dist'] / noop_w['torchrun']:.3f}x, "
            f"warm/cold ranks {noop_w['sparkml_dist'] / noop_w['sparkml_dist_cold']:.3f}x"
        )
    if "mlp" in results:
        print("(b) DDP MLP samples/s (rank 0's training loop)")
        sps = {k: med([v for _, v in vals]) for k, vals in results["mlp"].items()}
        for k, v in sps.items():
            print(f"  {k:18s} {v:12,.0f}")
        print(
            f"  ours/torchrun {sps['sparkml_dist'] / sps['torchrun']:.3f}x, "
            f"ours/torch_distributor {sps['sparkml_dist'] / sps['torch_distributor']:.3f}x"
        )
    if "ckpt" in results:
        print("(d) checkpoint overhead on the DDP MLP (ours), samples/s")
        sps = {k: med([v for _, v in vals]) for k, vals in results["ckpt"].items()}
        for k, v in sps.items():
            print(f"  {k:18s} {v:12,.0f}  overhead {1 - v / sps['no_checkpoint']:+.1%}")
    if "hvd_noop" in results:
        print(
            "(e) Horovod no-op job (hvd.init + one allreduce), median wall seconds over "
            f"{args.repeats} rounds"
        )
        w = {k: med([x for x, _ in v]) for k, v in results["hvd_noop"].items()}
        for k, x in w.items():
            print(f"  {k:18s} {x:7.2f}s")
        print(f"  ours/horovod.spark.run {w['sparkml_dist'] / w['horovod_spark']:.3f}x (target <= 0.5)")
    if "hvd_mlp" in results:
        print("(e) Horovod DistributedOptimizer MLP samples/s (rank 0's training loop)")
        sps = {k: med([v for _, v in vals]) for k, vals in results["hvd_mlp"].items()}
        for k, v in sps.items():
            print(f"  {k:18s} {v:12,.0f}")
        print(f"  ours/horovod.spark.run {sps['sparkml_dist'] / sps['horovod_spark']:.3f}x (target >= 0.95)")
    if "data" in results:
        print(f"(c) {args.rows:,} x 50 DataFrame into per-rank tensors, median wall seconds")
        data_w = _nan_default({k: med([w for w, _ in v]) for k, v in results["data"].items()})
        for k, vals in results["data"].items():
            print(f"  {k:18s} {data_w[k]:7.2f}s  last: {vals[-1][1]}")
        td_feed = data_w["torch_distributor"] - data_w["torch_distributor_launch"]
        for k in ("sparkml_dist", "sparkml_dist_spark"):
            feed = data_w[k] - data_w["sparkml_dist_launch"]
            print(
                f"  {k}: end to end {data_w['torch_distributor'] / data_w[k]:.1f}x faster than "
                f"torch_distributor; feeding alone (minus each one's launch) {feed:.2f}s vs "
                f"{td_feed:.2f}s = {td_feed / feed:.1f}x"
            )
            ratio = max(r["peak_growth_mb"] / r["shard_mb"] for r in results["data"][k][-1][1])
            print(f"  {k}: peak rank memory growth / shard size = {ratio:.2f}")
    spark.stop()
    if args.figure:
        _figure(args, results)


def session_child(mode: str, runs: int) -> None:
    """(f) in a new process: a new session, ``runs`` no-op runs back to back; their wall seconds."""
    local_session("bench_runner_session")
    from sparkml_dist.runner import BarrierRunner

    walls = []
    for _ in range(runs):
        t = time.perf_counter()
        BarrierRunner(2, log_ranks="none", warm_ranks=mode == "warm").run(noop)
        walls.append(time.perf_counter() - t)
    print("SESSION " + json.dumps(walls), flush=True)


def session_rounds(repeats: int, runs: int) -> None:
    """(f): each round, a new session per contender (alternating which goes first)."""
    out = {"warm": [], "cold": []}
    for r in range(repeats):
        for mode in ("warm", "cold") if r % 2 == 0 else ("cold", "warm"):
            cmd = [sys.executable, os.path.abspath(__file__), "--session-child", mode]
            proc = subprocess.run(
                cmd + ["--session-runs", str(runs)], capture_output=True, text=True, timeout=900
            )
            if "SESSION " not in proc.stdout:
                raise SystemExit(f"the {mode} session failed:\n{proc.stderr[-3000:]}")
            walls = json.loads(proc.stdout.split("SESSION ", 1)[1].splitlines()[0])
            out[mode].append(walls)
            print(f"round {r} session {mode:4s} " + " ".join(f"{w:6.2f}s" for w in walls), flush=True)
    med = {mode: [statistics.median(col) for col in zip(*rows)] for mode, rows in out.items()}
    print(f"\n(f) a new session's no-op runs back to back (2 ranks), median of {repeats} sessions each")
    for mode, walls in med.items():
        print(f"  {mode:4s} " + "  ".join(f"run {i + 1}: {w:5.2f}s" for i, w in enumerate(walls)))
    if runs > 1:
        print(
            f"  first run warm/cold {med['warm'][0] / med['cold'][0]:.3f}x (target: no worse than cold); "
            f"second run warm {med['warm'][1]:.2f}s (target <= 0.6 s), cold {med['cold'][1]:.2f}s"
        )


def _figure(args, results) -> None:
    """The no-op job's and the DataFrame feeding's median wall seconds, ours first."""
    from figures import save

    panels = []
    if "noop" in results:
        walls = {k: statistics.median(w for w, _ in v) for k, v in results["noop"].items()}
        panels.append({"title": "no-op job on 2 ranks (init + one all-reduce)", "ylabel": "wall seconds",
                       "bars": walls})  # fmt: skip
    if "data" in results:
        walls = {k: statistics.median(w for w, _ in v) for k, v in results["data"].items()}
        ours = [k for k in ("sparkml_dist", "sparkml_dist_spark", "torch_distributor") if k in walls]
        title = f"{args.rows:,} x 50 DataFrame into rank tensors"
        panels.append({"title": title, "ylabel": "wall seconds", "bars": {k: walls[k] for k in ours}})
    command = "python benchmarks/bench_runner.py " + " ".join(sys.argv[1:])
    save(args.figure, "bars", {"panels": panels}, command)


HUNG = "hung or failed: not timed"


def _nan_default(walls: dict) -> dict:
    """Medians by contender; NaN for one whose every round hung."""
    import collections

    return collections.defaultdict(lambda: float("nan"), walls)


def _td_all_ranks(cols, rows_per_rank):
    """TorchDistributor returns rank 0's value only: the load measured on rank 0."""
    return td_load(cols, rows_per_rank)


if __name__ == "__main__":
    main()
