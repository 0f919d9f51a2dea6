"""One run of a :class:`~sparkml_dist.runner.BarrierRunner`: the state a call holds.  [driver]

``BarrierRunner`` is configuration only; each ``run()`` / ``run_with_data()`` builds a
:class:`Run` holding what belongs to that call: its launcher (chosen once from ``np``), the
session, the tasks, the deadline, the attempts and the MLflow run.  Two calls of one runner from
two threads therefore never share state.

Steps: check (:mod:`.admission`) -> plan the data (:mod:`.data`) -> attempt: a fresh run id,
log channel and rendezvous, launched by the launcher (:mod:`.launchers`) -> rank 0's result (or
every rank's); on a failure, its root cause (:mod:`.failures`) and a restart if allowed.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from dataclasses import replace
from typing import Any, Callable, List, Optional, Tuple

from .. import _spark_env, collection, progress, tracking
from ..channel import new_secret
from ..channel.server import listen
from ..errors import WorkerError
from . import admission, decommission, failures, launchers, peer_exchange, protocol, roles, sizing
from .data.plan import plan
from .deadlines import Deadline
from .elastic import executor_loss
from .task_spec import TaskSpec
from .tasks.spares import Spares
from .timing import report as timing_report

log = logging.getLogger(__name__)


class Run:
    """One call of ``runner.run`` / ``run_with_data`` (see the module docstring)."""

    def __init__(
        self,
        runner,
        df,
        main: Callable,
        args: tuple,
        kwargs: dict,
        return_all: bool,
        replicas=None,
        streams=None,
    ):
        self.launcher = launchers.choose(runner.np, df, runner.spark)
        self.data = plan(df, runner, replicas, streams, self.launcher.local)  # refusals by name
        if df is not None:
            executor_loss.check_resizable_data(runner, streams, replicas)
        self.runner, self.return_all = runner, return_all
        self.main = main
        self.spark = self.launcher.spark
        script = getattr(main, "__module__", "") == "sparkml_dist.runner.script" and len(args) > 1
        self.job = str(args[1]) if script else getattr(main, "__qualname__", "function")  # names kept dirs
        self.payload = admission.payload(main, args, kwargs)
        self.per_task = 1  # ranks per barrier task: one per GPU the task holds
        self.world = runner.world_size  # this attempt's ranks: fewer after an elastic restart (min_np)
        self.attempt = 0
        self.track: Any = tracking.NullRun()  # rank 0's metrics land there
        spark = self.spark if isinstance(self.launcher, launchers.SparkLauncher) else None
        self.in_place = decommission.in_place(spark, runner)  # a notice: its ranks leave, the others go on
        self.handover = decommission.armed(spark, runner) and not self.in_place  # ... or: save and go on
        self.handovers = 0  # attempts ended by one (not counted against max_restarts)

    def execute(self):
        """The whole run, restarts included, inside its MLflow run (when tracking is on)."""
        r = self.runner
        settings = {
            "np": r.np,
            "backend": r.backend,
            "use_gpu": r.placement.use_gpu,
            "timeout": r.timeouts.total,
            "max_restarts": r.max_restarts,
            "function": getattr(self.main, "__qualname__", repr(self.main)),
            "with_data": self.data is not None,
        }
        started = time.perf_counter()
        plain = "Spark tasks (executor_loss='replace')"
        where = self.launcher.what if r.executor_loss == "restart" else plain
        with (
            tracking.job_run("BarrierRunner", r.mlflow, settings) as self.track,
            progress.phase(f"running {self.world} ranks of {settings['function']} on {where}"),
        ):
            try:
                return self._attempts()
            finally:
                if self.data is not None:
                    self.data.remove()
                self.track.log_metrics(
                    {"wall_seconds": time.perf_counter() - started, "attempts": self.attempt}
                )

    def _attempts(self):
        r = self.runner
        self.per_task = self.launcher.ranks_per_task(r)
        deadline = Deadline.after(r.timeouts.total)  # the whole run's: planning, slot wait, restarts
        self.launcher.check(r, self.world // self.per_task, deadline)
        self.launcher.check_python(self.main, self.world // self.per_task)  # before any rank starts
        data, data_df = self._shards(deadline)
        tries: List[WorkerError] = []
        while True:
            try:
                again = bool(tries) or self.handovers > 0  # not the first attempt
                if again and r.min_np:  # elastic: as many ranks as the cluster holds now
                    world = sizing.restart_world(
                        self.spark,
                        r.world_size,
                        r.min_np,
                        self.per_task,
                        deadline.remaining(r.timeouts.start or 60.0),
                        r.sink,
                    )
                    if world != self.world:
                        self.world = world
                        data, data_df = self._shards(deadline)  # the rows dealt again for it
                if again:  # a lost executor's replacement may still be starting
                    self.launcher.check(r, self.world // self.per_task, deadline)
                return self._attempt(data, data_df, deadline)
            except decommission.HandOver as handed:
                self.handovers += 1
                r.sink(
                    f"[sparkml_dist] attempt {self.attempt} handed over (executor {handed.executor} "
                    "decommissioned): starting again from its checkpoint on the executors that stay "
                    "(not counted against max_restarts)\n"
                )
            except WorkerError as exc:
                tries.append(exc)
                stop = failures.restart_verdict(tries, r.max_restarts)
                if stop and len(tries) == 1:
                    raise
                if stop:
                    raise failures.final_error(tries, stop) from exc
                cause, n = failures.cause(exc), len(tries)
                log.warning("run attempt %d failed (%s); restart %d of %d", n, cause, n, r.max_restarts)
                r.sink(
                    f"[sparkml_dist] attempt {n} failed: {cause}; restarting "
                    f"({n} of {r.max_restarts}) with a fresh rendezvous\n"
                )

    def _shards(self, deadline: Deadline):
        """(the TaskSpec's ``data``, the DataFrame whose partition r is task r's rows or None)."""
        if self.data is None:
            return None, None
        return self.data.deal(self.world, self.per_task, deadline, readers=len(self._returning()))

    def _task_spec(self, run_id: str, channel: Tuple[str, int], secret: bytes, data) -> TaskSpec:
        r, spark = self.runner, self.spark
        checkpoint = ()
        if r.checkpoint_dir:
            from .protocol import CHECKPOINT_DIR_ENV

            d = r.checkpoint_dir
            checkpoint = ((CHECKPOINT_DIR_ENV, d if "://" in d else os.path.abspath(d)),)
            if self.handover:
                checkpoint += ((protocol.HANDOVER_ENV, "1"),)
        if self.in_place:
            checkpoint += ((protocol.LEAVE_ENV, "1"),)
        checkpoint += executor_loss.resize_env(r)  # min_np in place: the ranks' wait and floor
        env = replace(r.env, tracking=tracking.rank_env(self.track), checkpoint=checkpoint)
        return TaskSpec(
            run_id=run_id,
            world_size=self.world,
            payload=self.payload,
            backend=r.backend,
            channel=channel,
            secret=secret,
            return_all=self.return_all,
            max_result_bytes=_spark_env.max_result_bytes(spark),
            timeouts=r.timeouts,
            placement=r.placement,
            logs=r.logs.within(self.world),
            workdir=r.workdir,
            env=env,
            data=data,
            local_gpus=self.launcher.rank_gpus(r),
            ranks_per_task=self.per_task,
            attempt=self.attempt,
            launch=(_spark_env.driver_host(spark), os.getcwd()),
            job=self.job,
            warm_ranks=r.warm_ranks,
            max_restarts=r.max_restarts,  # a rank lost inside elastic.run: replaced in place, as many times
            # on a local master a task's stderr is the driver's console, which already shows the
            # streamed lines: copying them there too would print each line twice
            echo=spark is not None and not _spark_env.local_master(spark),
            roles=r.roles,
            executor_loss=r.executor_loss,
        )

    def _attempt(self, data, data_df, deadline: Deadline):
        """One launch: a fresh run id, log channel and rendezvous."""
        r = self.runner
        self.attempt += 1
        monitor = failures.Monitor(self.world, r.sink, r.backend_spec, self.world // self.per_task)
        monitor.on_metrics = self.track.log_metrics
        board = timing_report.Board(self.world, r.sink, monitor.hosts)  # each rank's step times
        monitor.on_timing = board.add
        secret = new_secret()
        host = _spark_env.driver_host(self.spark)
        tasks = self.world // self.per_task
        server = listen(secret, monitor.on_message, host, replies=True, expected=tasks)
        spark = self.spark if isinstance(self.launcher, launchers.SparkLauncher) else None
        quiet = _QuietChannel(server, r, self.launcher, self.world // self.per_task)
        watch = None
        if decommission.classic(spark):  # which executor runs each rank, and whether it is leaving
            watch = decommission.Watch(spark, r.sink, self.handover or self.in_place, self.in_place)
        if watch is not None:  # which executor runs each rank: a lost one is known at once
            monitor.on_rendezvous, monitor.executor_gone = watch.add, watch.gone
        if r.roles is not None:  # the servers end once rank 0's function has returned
            _stop_servers_with_the_chief(monitor)
        ok, store, spares = False, None, None  # the run's store and warm spares (executor_loss)
        try:
            spec = self._task_spec(uuid.uuid4().hex[:12], (host, server.port), secret, data)
            plain = r.executor_loss == "replace"  # plain tasks: their exchange and store are the driver's
            spec = replace(spec, exchange="driver" if plain else peer_exchange.mode(spark, host))
            if plain:
                store = executor_loss.serve_store(host, r.timeouts.collective)
                found = (host, store.port)
                left = watch.left if watch is not None else (lambda ranks: False)
                monitor.announces = executor_loss.exchange(monitor, r, tasks, self.per_task, found, left)
                spares = Spares.start(spark, spec, tasks, ready=lambda: monitor.announces.answered)
            with _spark_env.quiet_task_failures(self.spark):  # ours to report: see failures.Monitor
                table = self.launcher.launch(r, data_df, spec, monitor, deadline)
            ranks = self._returning() if self.return_all else [0]
            results = collection.decode(table, ranks, what="rank")
            quiet.check()
            ok = True
            peer_exchange.remember(spark, host, self.world, server.accepted)  # later runs: no allGather
        except WorkerError as exc:
            if watch is not None and watch.noticed():  # the ranks saved and left: a handover
                raise decommission.HandOver(watch.notice) from exc
            raise
        finally:
            for stopping in (watch, spares):
                if stopping is not None:
                    stopping.stop()
            quiet.cancel()
            server.close()
            del store  # its server ends with the object: the ranks have ended
            monitor.end(ok)
            self._report_times(board, ok)
            if server.dropped:  # never silently: how many, whose, and where every line is
                r.sink(_not_shown(server.lines.not_shown(), r.logs.directory))
        if self.return_all:
            return [results[(k, 0)] for k in self._returning()]
        return results[(0, 0)]

    def _returning(self) -> range:
        """The ranks that run the function (all but reduction servers), whose results return_all gives."""
        roles = self.runner.roles
        return range(roles.readers if roles is not None else self.world)

    def _report_times(self, board, ok: bool) -> None:
        """The attempt's per-rank step times: the run's report (``last_run()``), its straggler line
        on the console (one the run's windows did not name already) and its figures in the MLflow
        run, when the attempt ended well."""
        report = board.report()
        timing_report.remember(report)
        if not ok:
            return
        if report.line and not board.named:  # a straggler no window showed: said at the end
            self.runner.sink(report.line)
        self.track.log_metrics(report.metrics())


def _not_shown(by_rank: dict, log_dir: Optional[str]) -> str:
    """The notice of the lines the driver did not show (``by_rank``: counts by rank)."""
    ranks = sorted(by_rank.items(), key=lambda kv: -kv[1])
    whose = ", ".join(f"rank {k}: {n:,}" if k is not None else f"{n:,} unnamed" for k, n in ranks[:8])
    more = f" and {len(ranks) - 8} more ranks" if len(ranks) > 8 else ""
    return (
        f"sparkml_dist: {sum(by_rank.values()):,} lines from the ranks were not shown ({whose}{more}): "
        "they came faster than this driver shows them (each rank may have a share of the driver's "
        "memory for lines waiting), or were still waiting when the run ended; every line is in its "
        "rank's executor log (stderr)" + (f" and in {log_dir}" if log_dir else "") + " (stream fewer "
        "ranks: log_ranks)\n"
    )


class _QuietChannel:
    """Says once, when no rank has connected to the driver's log channel while the run's barrier
    tasks have all been running for ``after`` seconds (or by the attempt's end), that live logs
    are off and where the ranks' output is instead."""

    after = 15.0  # a task connects as it starts (its connect gives up after 5 s)

    def __init__(self, server, runner, launcher, tasks: int) -> None:
        self.server, self.runner, self.tasks, self.said = server, runner, tasks, False
        self.stop = threading.Event()
        self.spark = launcher.spark if isinstance(launcher, launchers.SparkLauncher) else None
        if self.spark is not None and not _spark_env.is_connect(self.spark):
            threading.Thread(target=self._watch, name="sparkml_dist-quiet", daemon=True).start()

    def _running(self) -> bool:
        """A stage of ``tasks`` tasks, all running: the barrier stage (its tasks run at once)."""
        tracker = self.spark.sparkContext.statusTracker()
        for stage in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage)
            if info is not None and info.numTasks == self.tasks == info.numActiveTasks:
                return True
        return False

    def _watch(self) -> None:
        since = None
        while not self.stop.wait(1.0) and not self.server.accepted and not self.said:
            try:
                running = self._running()
            except Exception:  # noqa: BLE001 - a status query must never fail the run
                return
            since = (since or time.monotonic()) if running else None
            if since is not None and time.monotonic() - since >= self.after:
                self.check()

    def check(self) -> None:
        if self.said or self.spark is None or self.server.accepted:
            return
        self.said = True
        where = self.runner.logs.directory
        kept = f"log_dir={where!r} and " if where else ""
        self.runner.sink(
            f"[sparkml_dist] live logs are off: no rank has reached the driver's log channel at "
            f"{self.server.address}:{self.server.port} (a firewall, or an address executors cannot "
            f"reach); training goes on and each rank's output is kept in {kept}its executor's "
            "stderr. To see it live, let executors connect to the driver's ports or set "
            "spark.driver.host to an address they reach.\n"
        )

    def cancel(self) -> None:
        self.stop.set()


def _stop_servers_with_the_chief(monitor: failures.Monitor) -> None:
    """With roles: each task's reply channel kept at its rank's rendezvous, and a stop sent to all
    of them when rank 0's function returned (the chief's; with reduction servers, worker 0's):
    :class:`~sparkml_dist.runner.roles.StopServers`."""
    stop, earlier = roles.StopServers(), monitor.on_rendezvous

    def reached(rank, msg, send):
        earlier(rank, msg, send)
        stop.reached(rank, send)

    monitor.on_rendezvous, monitor.on_returned = reached, stop.done
