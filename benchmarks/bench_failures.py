"""What failures cost: time to N training steps undisturbed vs with a rank killed every tenth of the run.

A fixed DDP job (2 ranks as local processes, gloo; an MLP on random batches, ``--steps`` steps,
a checkpoint every ``--every`` steps written with ``checkpoint.save(..., blocking=False)``) runs
undisturbed, then with failures injected for real: every tenth of the undisturbed run's length
the benchmark SIGKILLs the process of rank ``--victim`` (its pid read from the file the rank wrote
at its start, checked to be a live rank process before the kill and gone after it), and the
runner restarts (``max_restarts``) from the latest checkpoint.  It prints time-to-N-steps of both,
the ratio, and where the difference went: the steps trained twice (done after the latest
checkpoint, lost with the rank) and the time from each kill to the first step of the next attempt
(the restart: new processes, rendezvous, loading the checkpoint), with warm ranks (forked from
the pool, the default) and cold ones (``warm_ranks=False``), and under ``elastic.run`` (the
survivor keeps running, the new rank takes the last in-memory commit from it), interleaved.

    python benchmarks/bench_failures.py [--steps 15000] [--every 250] [--repeats 1] [--kinds elastic,cold]
                                         [--kill rank|executor|host]
                                         [--commit-every 25]

``--kill executor`` runs the same job as 2 barrier tasks on ``local-cluster[2,1,1024]`` and hits
the executor under the victim rank instead: SIGKILLed (cold and warm restarts; ``in_place``: the
elastic job with ``executor_loss="replace"``, the survivor keeps running) or decommissioned (SIGPWR:
the ranks hand over at an agreed step; ``decommission_in_place``: the elastic job's rank leaves at
its next commit and only it starts again), with each loss broken down (:mod:`executor_loss`).
``--kill host`` runs it on a Spark standalone cluster of one-core worker JVMs started here (2 for
the ranks and 9 spares for each run with losses, so no lost host's executor is started again on
the ranks' cores) and SIGKILLs every process of the victim's "host" at once: its worker, its
executor, Spark's Python side, the warm pools and the rank.  A host lost with ``min_np`` (the
world shrinks, then grows back) is tested in the several-hosts pass, not timed here.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def train(steps: int, every: int, run_dir: str, width: int = 2048) -> int:
    """The job on every rank: resumes from the latest checkpoint, logs each step (rank 0) and its pid."""
    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import checkpoint, init_process_group

    init_process_group()
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    state = checkpoint.load()
    start = 0
    if state is not None:
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
    with open(os.path.join(run_dir, f"pid-{rank}.tmp"), "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(os.path.join(run_dir, f"pid-{rank}.tmp"), os.path.join(run_dir, f"pid-{rank}"))
    log = open(os.path.join(run_dir, "steps.jsonl"), "a", buffering=1) if rank == 0 else None
    if log:
        log.write(json.dumps({"start": start, "t": time.time()}) + "\n")
    g = torch.Generator().manual_seed(rank)
    for step in range(start, steps):
        X = torch.randn(256, 64, generator=g)
        loss = model(X).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if log:
            log.write(json.dumps({"step": step, "t": time.time()}) + "\n")
        if checkpoint.due(step, every):
            checkpoint.save(
                {"model": net.state_dict(), "opt": opt.state_dict(), "step": step}, step, blocking=False
            )
    return steps


def train_elastic(steps: int, every: int, run_dir: str, width: int = 2048) -> int:
    """The same job under ``elastic.run``: a commit in memory every ``every`` steps instead of a
    checkpoint; a killed rank is replaced in place and takes the last commit from rank 0."""
    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import elastic, init_process_group

    init_process_group()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    state = elastic.TorchState(model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.01), step=0)
    elastic.run(_elastic_steps)(state, steps, every, run_dir, dist.get_rank())
    return steps


def _elastic_steps(state, steps: int, every: int, run_dir: str, rank: int) -> None:
    import torch

    model = torch.nn.parallel.DistributedDataParallel(state.model)  # in every group again
    with open(os.path.join(run_dir, f"pid-{rank}.tmp"), "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(os.path.join(run_dir, f"pid-{rank}.tmp"), os.path.join(run_dir, f"pid-{rank}"))
    log = open(os.path.join(run_dir, "steps.jsonl"), "a", buffering=1) if rank == 0 else None
    if log:
        log.write(json.dumps({"start": state.step, "t": time.time()}) + "\n")
    g = torch.Generator().manual_seed(rank * 1_000_003 + state.step)
    for step in range(state.step, steps):
        loss = model(torch.randn(256, 64, generator=g)).square().mean()
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        if log:
            log.write(json.dumps({"step": step, "t": time.time()}) + "\n")
        state.step = step + 1
        if state.step % every == 0:
            state.commit()


def _rank_process(pid: int):
    """The live rank process ``pid``: started cold (``python -c RANK_ENTRY``) or forked by a warm
    pool (its command line the pool's, its parent the pool)."""
    import psutil

    from sparkml_dist.runner.tasks.warm_pool import POOL_MARK

    try:
        proc = psutil.Process(pid)
        cmd = " ".join(proc.cmdline())
        if "sparkml_dist.runner.tasks.rank" in cmd:
            return proc
        return proc if POOL_MARK in cmd and POOL_MARK in " ".join(proc.parent().cmdline()) else None
    except (psutil.Error, OSError, AttributeError):
        return None


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def injector(run_dir: str, victim: int, interval: float, stop: threading.Event, kills: list) -> None:
    """Every ``interval`` s, SIGKILL the victim rank's live process; record (time, pid)."""

    next_at = time.time() + interval
    while not stop.wait(0.05):
        if time.time() < next_at:
            continue
        try:
            pid = int(open(os.path.join(run_dir, f"pid-{victim}")).read())
        except (OSError, ValueError):
            continue
        if kills and kills[-1][1] == pid:
            continue  # the killed attempt's pid: wait for the restarted rank's
        proc = _rank_process(pid)
        if proc is None:
            continue
        os.kill(pid, signal.SIGKILL)
        # gone, without reaping it: the rank is the runner's child, its exit status is the runner's
        deadline = time.time() + 10
        while _alive(pid):
            if time.time() > deadline:
                raise SystemExit(f"rank process {pid} did not die after SIGKILL")
            time.sleep(0.01)
        kills.append((time.time(), pid))
        print(f"  killed rank {victim} (pid {pid})", flush=True)
        next_at = time.time() + interval


def one_run(
    steps: int, every: int, interval: float = 0.0, victim: int = 1, kind: str = "warm", commit_every=None
) -> dict:
    """``kind``: "warm" / "cold" ranks restarting from checkpoints, or "elastic" (warm, in place,
    committing in memory every ``commit_every`` steps, default ``every``)."""
    from sparkml_dist.runner import BarrierRunner

    with tempfile.TemporaryDirectory(prefix="bench-failures-") as run_dir:
        kills: list = []
        stop = threading.Event()
        if interval > 0:
            threading.Thread(
                target=injector, args=(run_dir, victim, interval, stop, kills), daemon=True
            ).start()
        runner = BarrierRunner(
            -2,
            checkpoint_dir=os.path.join(run_dir, "ckpt"),
            max_restarts=100,
            log_ranks="none",
            timeout=3600,
            warm_ranks=kind != "cold",
        )
        t0 = time.time()
        try:
            if kind == "elastic":
                runner.run(train_elastic, steps, commit_every or every, run_dir)
            else:
                runner.run(train, steps, every, run_dir)
        finally:
            stop.set()
        wall = time.time() - t0
        events = [json.loads(line) for line in open(os.path.join(run_dir, "steps.jsonl"))]
    starts = [e for e in events if "start" in e]
    step_lines = [e for e in events if "step" in e]
    trained = len(step_lines)
    restart_s = 0.0
    for (killed_at, _), nxt in zip(kills, starts[1:]):
        first = next((e["t"] for e in step_lines if e["t"] > nxt["t"]), nxt["t"])
        restart_s += first - killed_at
    return {
        "wall": wall,
        "kills": len(kills),
        "trained": trained,
        "redone": trained - steps,
        "restart_s": restart_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=15000)
    ap.add_argument("--every", type=int, default=250, help="steps between checkpoints")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--victim", type=int, default=1, help="the rank killed")
    ap.add_argument(
        "--kinds",
        default=None,
        help="contenders with failures (rank: elastic,warm,cold; "
        "executor: cold,warm,decommission,in_place,cold_spares_in_place,decommission_in_place)",
    )
    ap.add_argument(
        "--kill",
        choices=("rank", "executor", "host"),
        default="rank",
        help="what is lost (host: a standalone worker with its executor, pools and ranks; spares on others)",
    )
    ap.add_argument("--executors", type=int, default=2, help="--kill executor: local-cluster's executors")
    ap.add_argument(
        "--commit-every", type=int, default=None, help="elastic: steps between in-memory commits (--every)"
    )
    ap.add_argument("--keep-steps", default="", help="--kill executor|host: keep each run's step log here")
    args = ap.parse_args()
    os.environ["PYTHONPATH"] = (
        HERE + os.pathsep + os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    if args.kill in ("executor", "host"):
        import executor_loss

        args.kinds = args.kinds or ("in_place" if args.kill == "host" else "cold,warm,decommission,in_place")
        return executor_loss.main(args, train, train_elastic)
    args.kinds = args.kinds or "elastic,warm,cold"
    rows = []
    one_run(200, args.every)  # untimed: the warm pool of this environment is started
    for r in range(args.repeats):
        clean = one_run(args.steps, args.every)
        print(f"round {r} undisturbed: {clean['wall']:.1f} s, {clean['trained']} steps", flush=True)
        failed = {}
        kinds = tuple(args.kinds.split(","))
        for kind in kinds if r % 2 == 0 else kinds[::-1]:  # interleaved
            failed[kind] = f = one_run(
                args.steps, args.every, clean["wall"] / 10, args.victim, kind, args.commit_every
            )
            print(
                f"round {r} with failures, {kind} ranks: {f['wall']:.1f} s, {f['kills']} ranks killed, "
                f"{f['redone']} steps trained twice, {f['restart_s']:.1f} s from kills to the next "
                "first step",
                flush=True,
            )
        rows.append((clean, failed))
    clean, failed = rows[-1]
    per_step = clean["wall"] / args.steps
    print(
        f"\n{args.steps} steps, a checkpoint every {args.every} (in the background), a rank killed every "
        f"{clean['wall'] / 10:.1f} s (a tenth of the undisturbed run):"
    )
    for kind, f in failed.items():
        lost = f["wall"] - clean["wall"]
        print(
            f"  {kind} ranks: undisturbed {clean['wall']:.1f} s; with {f['kills']} failures "
            f"{f['wall']:.1f} s: {f['wall'] / clean['wall']:.2f}x (target <= 1.15x); time lost "
            f"{lost:.1f} s: restarts {f['restart_s']:.1f} s ({f['restart_s'] / max(1, f['kills']):.2f} s "
            f"each), work redone ~{f['redone'] * per_step:.1f} s ({f['redone']} steps)"
        )


if __name__ == "__main__":
    main()
