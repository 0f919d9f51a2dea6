"""One command that proves the GPU paths on a GPU machine: ``make gpu-check`` (or this file).

No Java and no Spark JVM: ranks run as local processes (``np < 0``), as on a GPU box with only
Python.  In about ten minutes on one GPU it runs, and prints one table of:

1. ``tests/gpu`` (pytest: NCCL, torchrun's device rule, feeding, planning, pipelines);
2. DDP with NCCL through the runner vs ``torchrun`` on the same script (samples/s ratio);
3. FSDP2 on ``cuda`` (equal to one process, 1e-4) and a 2-stage pipeline on ``cuda`` (2 GPUs);
4. a 1,000,000 x 50 shard to the GPU (``shard().to_torch(device=...)`` vs numpy + ``.to()``);
5. the drop-in ``TorchDistributor`` with an unchanged ``torch.cuda.set_device(LOCAL_RANK)``;
6. Horovod's Keras program on ``sparkml_dist.keras`` (Keras 3, torch backend) on ``cuda``, NCCL.

On a machine without CUDA it says so ("no GPU: skipped N checks") and exits 0 without pretending;
on a GPU machine a failed check exits 1.  Record the table in the README (date, GPU, torch).

    python scripts/gpu_check.py [--steps 200] [--repeats 2]
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (ROOT, os.path.join(ROOT, "benchmarks"), os.environ.get("PYTHONPATH")) if p
)

CHECKS = (
    "tests/gpu",
    "DDP (NCCL): runner vs torchrun samples/s",
    "FSDP2 on cuda equals one process",
    "2-stage pipeline on cuda equals one process",
    "shard to GPU: to_torch vs numpy + .to()",
    "TorchDistributor drop-in, set_device(LOCAL_RANK)",
    "Keras 3 via sparkml_dist.keras on cuda, NCCL",
)


def _tests_gpu() -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/gpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    summary = (proc.stdout.strip().splitlines() or ["?"])[-1]
    if proc.returncode not in (0,):
        raise RuntimeError(summary + "\n" + proc.stdout[-3000:])
    return summary


def _ddp(n: int, steps: int, repeats: int) -> str:
    import statistics

    from bench_gpu import gpu_mlp, torchrun

    from sparkml_dist.runner import BarrierRunner

    ours, theirs = [], []
    for r in range(repeats):  # interleaved, the order swapped every round
        for who in ("ours", "torchrun") if r % 2 == 0 else ("torchrun", "ours"):
            if who == "ours":
                ours.append(
                    BarrierRunner(-n, use_gpu=True, log_ranks="none", timeout=900).run(gpu_mlp, steps)
                )
            else:
                theirs.append(torchrun(f"gpu_mlp({steps})", n)[1])
    a, b = statistics.median(ours), statistics.median(theirs)
    return f"{a:,.0f} vs {b:,.0f} samples/s = {a / b:.3f}x ({n} GPU(s), median of {repeats})"


def _fsdp(n: int) -> str:
    from sparkml_dist.runner import BarrierRunner
    from tests.support import parallel_helpers as ph

    state, _ = ph.train_unsplit(4, 32)
    out = BarrierRunner(-n, use_gpu=True, timeout=600).run(ph.train_fsdp, 4, 32, 0.05, True)
    diff = max((out["state"][k].cpu() - state[k]).abs().max().item() for k in state)
    if diff > 1e-4:
        raise RuntimeError(f"FSDP2 weights differ from one process by {diff:.2e}")
    return f"{n} rank(s), max |diff| {diff:.1e}"


def _pipeline(n: int) -> str:
    from sparkml_dist.runner import BarrierRunner
    from tests.support import parallel_helpers as ph

    if n < 2:
        return "SKIP: needs 2 GPUs (one stage per GPU)"
    state, _ = ph.train_unsplit(4, 32)
    out = BarrierRunner(-2, use_gpu=True, timeout=600).run(ph.train_pipeline, 4, 32, 2, "interleaved")
    diff = max((out["state"][k].cpu() - state[k]).abs().max().item() for k in state)
    if diff > 1e-4:
        raise RuntimeError(f"pipeline weights differ from one process by {diff:.2e}")
    return f"2 stages, max |diff| {diff:.1e}"


def _feed() -> str:
    from bench_gpu import shard_to_gpu

    from sparkml_dist.runner import BarrierRunner

    out = BarrierRunner(-1, use_gpu=True, log_ranks="none").run(shard_to_gpu)
    return (
        f"{out['ours_s']:.3f}s vs {out['numpy_to_s']:.3f}s = {out['numpy_to_s'] / out['ours_s']:.2f}x faster"
    )


def _drop_in(n: int) -> str:
    from sparkml_dist.distributor import TorchDistributor
    from tests.support import gpu_helpers as g

    dist = TorchDistributor(num_processes=n, local_mode=True, use_gpu=True, timeout=600)
    out = dist._runner(None).run(g.set_device_local_rank)
    if len(set(out["uuids"])) != n:
        raise RuntimeError(f"ranks shared GPUs: {out['uuids']}")
    return f"{n} rank(s) on {n} distinct GPU(s), all-reduce {out['sum']:.0f}"


def _keras(n: int) -> str:
    import importlib.util

    from sparkml_dist.runner import BarrierRunner
    from tests.support import gpu_helpers as g

    if importlib.util.find_spec("keras") is None:
        return "SKIP: Keras 3 is not installed here (pip install 'sparkml_dist[keras]')"
    out = BarrierRunner(-n, use_gpu=True, log_ranks="none", timeout=600).run(g.keras_on_gpu, return_all=True)
    for o in out:
        if not o["device"].startswith("cuda") or o["backend"] != "nccl" or o["keras"] != "torch":
            raise RuntimeError(f"not Keras on torch on a GPU with NCCL: {o}")
        if not o["loss"][-1] < o["loss"][0]:
            raise RuntimeError(f"the loss did not fall: {o['loss']}")
    if any(o["weights"] != out[0]["weights"] for o in out):
        raise RuntimeError("the ranks ended with different weights")
    return f"{n} rank(s) on {out[0]['device']}, loss {out[0]['loss'][0]:.3f} -> {out[0]['loss'][-1]:.3f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        for name in CHECKS:
            print(f"| {name} | skipped | no CUDA device |")
        print(f"no GPU: skipped {len(CHECKS)} checks (torch {torch.__version__}; run this on a GPU machine)")
        return 0
    n = torch.cuda.device_count()
    runs = (
        lambda: _tests_gpu(),
        lambda: _ddp(n, args.steps, args.repeats),
        lambda: _fsdp(n),
        lambda: _pipeline(n),
        lambda: _feed(),
        lambda: _drop_in(n),
        lambda: _keras(n),
    )
    rows, failed = [], 0
    started = time.monotonic()
    for name, run in zip(CHECKS, runs):
        t = time.monotonic()
        try:
            value, state = run(), "ok"
            if value.startswith("SKIP: "):
                value, state = value[6:], "skipped"
        except Exception as exc:  # noqa: BLE001 - every check runs; the table says which failed
            value, state = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}", "FAILED"
            traceback.print_exc()
            failed += 1
        rows.append((name, state, value, time.monotonic() - t))
        print(f"{state:7s} {name}: {value}", flush=True)
    gpu = torch.cuda.get_device_name(0)
    print(f"\nGPU check, {datetime.date.today()}, {n} x {gpu}, torch {torch.__version__}")
    print("| check | result | figures | seconds |\n|---|---|---|---|")
    for name, state, value, secs in rows:
        print(f"| {name} | {state} | {value} | {secs:.0f} |")
    print(f"{failed} failed, {len(rows) - failed} passed or skipped, in {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
