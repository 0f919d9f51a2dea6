"""``bench_failures.py --kill executor|host``: an executor or a host lost every tenth of the run.

On ``local-cluster[N,1,1024]`` (``--executors N`` JVMs, one slot each, 2 by default: a lost executor's
replacement has to start first; 3: a spare one takes its place at once; ``spark.decommission.enabled``),
the job of :mod:`bench_failures` (its ``train``) runs as 2 barrier tasks, undisturbed, then with the
executor under rank ``--victim`` hit at each tenth of the run's steps (9 losses: when rank 0 first
logs step ``steps * k / 10``, ``k`` = 1..9, once the rank that replaced the last victim runs; every
contender loses as many executors, however fast it trains; just before each in-place contender, an
untimed in-place run lets the driver's warm job start the spare executors' pools and standbys,
which on a cluster start on the spares' own cores and here would share the ranks' two (started
once before every contender, they ended within a 450 s undisturbed run: a pool's idle end is
300 s); ``--kill host``: on a standalone cluster of one-core workers instead, 2 + 9 a run with
losses, the victim's worker killed with everything on it, :func:`host_of`, so nothing starts again
on the ranks' cores):

* ``cold`` / ``warm``: the executor JVM is SIGKILLed (a node failure); the barrier stage ends and
  the run restarts from its latest checkpoint (``max_restarts``) once Spark has a new executor,
  with ranks started cold or from the warm pools of the executors left;
* ``decommission``: the executor is sent SIGPWR (a spot reclaim's notice, a scale-down); the driver
  sees it, the ranks save at one agreed step and the run starts again from that checkpoint;
* ``in_place``: the executor JVM is SIGKILLed under the job of ``train_elastic`` (``elastic.run``,
  a commit in memory every ``--commit-every`` steps) with ``executor_loss="replace"``: Spark runs
  only the lost task again, and its new rank joins rank 0, which keeps running;
* ``cold_spares_in_place``: ``in_place`` without the driver's warm jobs on the free slots
  (``SPARKML_DIST_WARM_SPARES=0``, :mod:`sparkml_dist.runner.tasks.spares`): the lost task's new
  executor starts its Python side and its pool (the torch import) only when the task comes;
* ``decommission_in_place``: the same job sent SIGPWR: the rank leaves at its next commit, Spark
  runs its task again elsewhere, and its new rank joins rank 0 at that commit.

Each loss is broken down from the driver's console and the steps rank 0 logged: detection (the
signal to the driver's line about it; in place: to the driver's line that Spark started the task
again, a new executor and its Python side included), the restart (that line to the first step of
the next attempt: a new executor, processes, rendezvous, checkpoint load; in place: the new rank's
start, the group formed again, the state from rank 0) and the steps trained twice.
"""

from __future__ import annotations

import os
import signal
import threading
import time

KEEP_STEPS = ""  # --keep-steps DIR: where each run's step log goes


def executor_of(rank_pid: int):
    """The executor JVM above rank ``rank_pid``'s task: the process that holds the other end of one
    of the rank's pipes (its control pipe, its stdio) and runs under an executor.  A rank forked by a
    warm pool is no descendant of its executor, and its ``/proc`` environment is the pool's."""
    import psutil

    pipes = set()
    for fd in os.listdir(f"/proc/{rank_pid}/fd"):
        try:
            target = os.readlink(f"/proc/{rank_pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("pipe:"):
            pipes.add(target)
    for pid in psutil.pids():
        if pid == rank_pid:
            continue
        try:
            if not any(os.readlink(f"/proc/{pid}/fd/{f}") in pipes for f in os.listdir(f"/proc/{pid}/fd")):
                continue
            process = psutil.Process(pid)
            while process is not None:
                if "CoarseGrainedExecutorBackend" in " ".join(process.cmdline()):
                    return process
                process = process.parent()
        except (OSError, psutil.Error):
            continue
    return None


def host_of(jvm) -> list:
    """Every process of the "host" under executor ``jvm`` on a standalone cluster: its worker JVM and
    everything below it (the executor, Spark's Python daemon and workers), the warm pools anchored to
    a process of that tree and the ranks they forked (a pool starts in a session of its own)."""
    import psutil

    worker = jvm.parent()
    if worker is None or "deploy.worker.Worker" not in " ".join(worker.cmdline()):
        raise RuntimeError(f"executor {jvm.pid} runs under no standalone worker: --kill host needs one")
    tree = [worker, *worker.children(recursive=True)]
    anchors = {f"/{p.pid}-" for p in tree}
    pools = {
        c.pid
        for c in psutil.net_connections("unix")
        if c.pid
        and isinstance(c.laddr, str)
        and "sparkml_dist-pool" in c.laddr
        and any(a in c.laddr for a in anchors)
    }
    for pid in pools:
        try:
            tree += [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            continue
    return tree


def one_run(
    train, steps: int, every: int, hits: int = 0, victim: int = 1, kind: str = "warm", host: bool = False
):
    import json
    import tempfile

    from sparkml_dist.runner import BarrierRunner

    lines = []
    with tempfile.TemporaryDirectory(prefix="bench-executor-loss-") as run_dir:
        struck: list = []
        stop = threading.Event()
        sig = signal.SIGPWR if kind.startswith("decommission") else signal.SIGKILL
        if hits > 0:
            marks = [steps * k // (hits + 1) for k in range(1, hits + 1)]
            args = (run_dir, victim, marks, sig, stop, struck, host)
            threading.Thread(target=hitter, args=args, daemon=True).start()
        runner = BarrierRunner(
            2,
            checkpoint_dir=os.path.join(run_dir, "ckpt"),
            max_restarts=100,
            log_ranks="none",
            timeout=3600,
            warm_ranks=kind != "cold",
            log_sink=lambda text: lines.append((time.time(), text)),
            executor_loss="replace" if kind.endswith("in_place") else "restart",
        )
        t0 = time.time()
        os.environ["SPARKML_DIST_WARM_SPARES"] = "0" if kind.startswith("cold_spares") else "1"
        try:
            runner.run(train, steps, every, run_dir)
        finally:
            stop.set()
            os.environ.pop("SPARKML_DIST_WARM_SPARES")
        wall = time.time() - t0
        events = [json.loads(line) for line in open(os.path.join(run_dir, "steps.jsonl"))]
        if KEEP_STEPS:  # rank 0's step log, kept for a look at the step rate around each loss
            import shutil

            os.makedirs(KEEP_STEPS, exist_ok=True)
            name = f"{kind if hits else 'undisturbed'}-{steps}-{time.strftime('%H%M%S')}.jsonl"
            shutil.copy(os.path.join(run_dir, "steps.jsonl"), os.path.join(KEEP_STEPS, name))
            with open(os.path.join(KEEP_STEPS, name + ".hits"), "w") as fh:
                json.dump(struck, fh)
    return _breakdown(wall, steps, struck, events, lines)


def _last_step(run_dir: str) -> int:
    """The last step rank 0 logged (``steps.jsonl``'s last whole line), -1 before any."""
    import json

    try:
        with open(os.path.join(run_dir, "steps.jsonl"), "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 4096))
            tail = fh.read().split(b"\n")[-2::-1]
    except OSError:
        return -1
    for line in tail:
        try:
            return int(json.loads(line).get("step", -1))
        except ValueError:
            continue
    return -1


def hitter(
    run_dir: str, victim: int, marks: list, sig, stop: threading.Event, hits: list, host: bool = False
) -> None:
    """Signal the executor under rank ``victim`` once rank 0 first logs each step of ``marks`` (a
    mark passed while the victim's replacement was starting is struck as soon as it runs: the
    pid file the rank writes names a process not struck before).  ``host``: every process of the
    victim's host instead (:func:`host_of`), all SIGKILLed within a few milliseconds."""
    seen: set = set()
    marks = list(marks)
    while marks and not stop.wait(0.05):
        if _last_step(run_dir) < marks[0]:
            continue
        try:
            pid = int(open(os.path.join(run_dir, f"pid-{victim}")).read())
            jvm = None if pid in seen else executor_of(pid)
        except (OSError, ValueError):
            continue
        if jvm is None:
            continue
        seen.add(pid)
        marks.pop(0)
        if host:
            procs = [pid, *{p.pid for p in host_of(jvm)}]
            for each in procs:  # the whole host at once: its worker, executor, pools and ranks
                try:
                    os.kill(each, sig)
                except ProcessLookupError:
                    pass
            hits.append(time.time())
            print(
                f"  {signal.Signals(sig).name} to the host of rank {victim} ({len(procs)} processes)",
                flush=True,
            )
            continue
        os.kill(jvm.pid, sig)
        hits.append(time.time())
        print(f"  {signal.Signals(sig).name} to the executor under rank {victim} (JVM {jvm.pid})", flush=True)


def _about_a_loss(text: str) -> bool:
    """The driver's line on a loss: an attempt failed or handed over, or a task started again."""
    lost = "lost with its" in text or "left its decommissioned" in text  # in place: its task runs again
    return ("attempt" in text and ("failed" in text or "handed over" in text)) or lost


def _breakdown(wall: float, steps: int, hits: list, events: list, lines: list) -> dict:
    starts = [e for e in events if "start" in e]
    step_lines = [e for e in events if "step" in e]
    said = [t for t, text in lines if _about_a_loss(text)]
    detect = restart = 0.0
    for hit_at, nxt in zip(hits, starts[1:]):
        seen_at = next((t for t in said if t >= hit_at), nxt["t"])
        first = next((e["t"] for e in step_lines if e["t"] > nxt["t"]), nxt["t"])
        detect += seen_at - hit_at
        restart += first - seen_at
    return {
        "wall": wall,
        "losses": len(hits),
        "trained": len(step_lines),
        "redone": len(step_lines) - steps,
        "detect_s": detect,
        "restart_s": restart,
    }


def main(args, train, train_elastic) -> None:
    """Undisturbed, then each of ``args.kinds`` (cold, warm, decommission, in_place) with losses,
    interleaved.  ``train`` / ``train_elastic``: bench_failures' jobs (passed in: defined in the
    script, they travel by value); the undisturbed run is ``train_elastic``'s when ``in_place`` is
    the only contender (the same steps, commits in memory instead of checkpoints)."""
    import contextlib

    from sparkml_dist.session import get_session

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    global KEEP_STEPS
    KEEP_STEPS = args.keep_steps
    kinds = tuple(args.kinds.split(","))
    host = args.kill == "host"
    if host and any(k.startswith("decommission") for k in kinds):
        raise SystemExit("--kill host: a host is lost (SIGKILL); decommissioning is --kill executor's")
    conf = {
        "spark.decommission.enabled": "true",
        # a SIGKILLed executor counts as its task's failure: a plain task (in_place) is retried
        # at most maxFailures - 1 times in a job (4 by default), then the job fails and restarts
        "spark.task.maxFailures": "1000",
        "spark.executorEnv.PYTHONPATH": os.environ["PYTHONPATH"],
    }
    with contextlib.ExitStack() as stack:
        if host:  # a standalone cluster of one-core workers: 2 for the ranks, 9 for each run's losses
            from tests.support.standalone import StandaloneCluster

            workers = 2 + 9 * len(kinds) * args.repeats
            master = stack.enter_context(StandaloneCluster(workers=workers, cores=1, memory="1g"))
            conf.update({"spark.executor.cores": "1", "spark.cores.max": str(workers)})
            conf["spark.executor.memory"] = "768m"
        else:
            master = f"local-cluster[{args.executors},1,1024]"
        spark = get_session(
            master, conf=conf, conf_file=os.path.join(root, "conf", "spark-local.yaml"), app_name="bench-loss"
        )
        spark.sparkContext.setLogLevel("ERROR")
        if host:
            _wait_executors(spark, workers)
        _runs(args, train, train_elastic, spark, kinds, host)


def _wait_executors(spark, n: int, timeout: float = 300.0) -> None:
    """Until ``n`` executors have registered (the driver counts itself in the status tracker)."""
    deadline = time.time() + timeout
    while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1 < n:
        if time.time() > deadline:
            raise TimeoutError(f"fewer than {n} executors registered within {timeout:.0f} s")
        time.sleep(1.0)


def _runs(args, train, train_elastic, spark, kinds: tuple, host: bool) -> None:
    try:
        one_run(train, 200, args.every)  # untimed: the executors' Python sides and pools start
        plain = train_elastic if all(k.endswith("in_place") for k in kinds) else train
        commits = args.commit_every or args.every
        for r in range(args.repeats):
            clean = one_run(plain, args.steps, commits if plain is train_elastic else args.every)
            print(f"round {r} undisturbed: {clean['wall']:.1f} s, {clean['trained']} steps", flush=True)
            failed = {}
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                job, every = (train_elastic, commits) if kind.endswith("in_place") else (train, args.every)
                if kind.endswith("in_place"):  # untimed, just before: the spares' pools start (or
                    # start again: a pool ends IDLE_S = 300 s after its last use, within a long run)
                    one_run(train_elastic, 3000, commits, kind="in_place")
                failed[kind] = one_run(job, args.steps, every, 9, args.victim, kind, host)
                print(f"round {r} {kind}: {failed[kind]}", flush=True)
        _print(args, clean, failed)
    finally:
        spark.stop()


def _print(args, clean: dict, failed: dict) -> None:
    per_step = clean["wall"] / args.steps
    where = (
        f"a standalone cluster of {2 + 9 * len(failed) * args.repeats} one-core workers"
        if args.kill == "host"
        else f"local-cluster[{args.executors},1,1024]"
    )
    what = "host (worker, executor, pools, ranks)" if args.kill == "host" else "executor"
    print(
        f"\n{args.steps} steps on {where} (2 tasks), a checkpoint every {args.every}; the {what} "
        f"under rank {args.victim} hit at each tenth of the steps:"
    )
    for kind, f in failed.items():
        n = max(1, f["losses"])
        how = "SIGPWR (decommissioned)" if kind.startswith("decommission") else "SIGKILL"
        place = kind.endswith("in_place")
        steps = "the new rank's start and the state from rank 0" if place else "restart"
        seen = "the lost task running again (Spark)" if place else "detection"
        ratio, lost = f["wall"] / clean["wall"], (f["wall"] - clean["wall"]) / n
        print(
            f"  {kind}: {f['losses']} {what.split()[0]}s {how}: {f['wall']:.1f} s vs {clean['wall']:.1f} s "
            f"undisturbed = {ratio:.2f}x (target <= 1.15x); per loss: {lost:.1f} s "
            f"of wall, {seen} {f['detect_s'] / n:.2f} s, "
            f"{steps} to the first step {f['restart_s'] / n:.2f} s, {f['redone'] / n:.0f} steps trained "
            f"twice (~{f['redone'] * per_step / n:.2f} s)"
        )
