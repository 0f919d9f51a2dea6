"""One barrier task: start its rank process(es), feed them, rendezvous, watch them.  [executor]

``barrier_task(batches, spec)`` is the ``mapInArrow(..., barrier=True)`` function.  The same
:func:`supervise` also runs on the driver in threads for ``np < 0`` (with a thread-based gang,
:mod:`.gangs`).  A task runs one rank, or one per GPU it holds (``spec.ranks_per_task``: task
``t`` runs ranks ``t*k ... t*k+k-1``, the first failure stopping its siblings).
What the task and its rank process exchange is in :mod:`sparkml_dist.runner.protocol`.

Failure semantics: when the rank process exits non-zero, dies of a signal, or does not reach the
rendezvous within ``start_timeout``, the task kills the rank's process group, reports the failure on
the log channel (so the driver cancels the job at once) and raises
:class:`~sparkml_dist.runner.protocol.RankFailure`.  Spark then aborts the barrier stage and kills
the other tasks; their rank processes die with them (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from typing import Iterable, Iterator, List, Optional

import pyarrow as pa

from ... import collection
from ...channel import LogClient
from ...channel.outbox import Outbox
from ...gpus import rank_gpus, task_gpus
from ...host import network
from .. import backends, protocol
from ..data.feeding import feed as _feed
from ..protocol import RankFailure
from ..task_spec import TaskSpec
from . import replace, warm_pool, workdirs
from .exchange import DriverReplies, exchange
from .rank_process import RankProcess, exit_text
from .siblings import await_all, clean_work_dir


class _RankTask:
    """One rank under one task: each method is one step of :func:`supervise`."""

    def __init__(self, gang, spec: TaskSpec, cancel: Optional[threading.Event], member: int = 0) -> None:
        k = spec.ranks_per_task
        self.gang, self.spec, self.cancel = gang, spec, cancel
        self.left_early = False  # its function did not return, yet it exited 0 (await_exit)
        self.rank = gang.rank * k + member  # task t runs ranks t*k ... t*k+k-1
        self.member = member
        self.backend = backends.get(spec.backend)
        self.started = time.monotonic()
        self.silent = False  # a sibling rank failed first: this one's stop is not a failure to report
        if spec.local_gpus is not None:
            self.gpus = list(spec.local_gpus[self.rank])
        else:
            self.gpus = task_gpus(gang.resources(), spec.placement.use_gpu, self.rank)
            if k > 1 and self.gpus is not None:
                self.gpus = rank_gpus(self.gpus, member, k, self.rank, spec.placement.gpus_per_rank)
        dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d]
        base = dirs[self.rank % len(dirs)] if dirs else None  # spread shard files over spark.local.dir
        self.workdir = tempfile.mkdtemp(prefix=f"sparkml_dist-{spec.run_id}-r{self.rank}-", dir=base)
        self.client: Optional[Outbox] = None
        self.process: Optional[RankProcess] = None
        self.rows = 0  # its shard's rows (the data phase's answer)
        self.local_rank = 0  # set when the ranks have exchanged addresses
        self.driver_error: Optional[str] = None  # why the driver's log channel could not be reached
        self.replies = DriverReplies()
        self.over = False  # its rank, started in place of a lost one, found the training over
        # the rank that decides the step the ranks hand over at; with executor_loss="replace", each
        # rank the driver tells (it leaves at its next commit, the others go on)
        if self.rank == 0 or spec.executor_loss == "replace":
            self.replies.notice_to.append(self.workdir)
        self.replies.stop_to.append(self.workdir)  # with roles: a server's end (runner.roles)
        self.name = spec.roles.label(self.rank) if spec.roles is not None else f"rank {self.rank}"
        self.start_message, self.watch_args = b"", {}
        launch_host, launch_dir = spec.launch or (None, None)
        # the address the peers are given: the one this host reaches the driver from
        self.address = network.host_address(toward=launch_host or (spec.channel or (None,))[0])
        here = not gang.echo_output or network.is_this_host(launch_host)  # local processes, or this machine
        self.cwd = workdirs.rank_cwd(spec.workdir.path, launch_dir, here, spec.job)
        self.kept_cwd = not here and not spec.workdir.path  # the default directory of an executor
        anchor = gang.pool_anchor()
        self.replacement = replace.Replacement(
            spec, self.rank, self.workdir, self.cwd, self.gpus, self.backend, anchor
        )

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def fail(self, message: str, code: Optional[int] = None, phase: str = "run") -> RankFailure:
        tail = self.process.lines() if self.process else []
        detail = dict(rank=self.rank, exit_code=code, phase=phase, message=message, tail=tail)
        detail.update(failed_at=time.time(), python=sys.executable)  # the rank's interpreter too
        if not self.silent:
            self._report(protocol.FRAME_FAILED, **detail, lines=self._lines_posted())
        return RankFailure(detail)

    def _lines_posted(self) -> int:
        """The rank's lines meant for the driver (every one, shown there or not): a final report
        carries it, so the driver counts what it did not show."""
        if self.process is not None and not self.process.running:
            self.process.join_output()  # its last lines posted first
        return self.client.posted(self.rank) if self.client is not None else 0

    def _report(self, frame: str, **fields) -> None:
        if self.client is not None:
            self.client.send({"type": frame, "rank": self.rank, **fields})

    def start(self) -> int:
        """Start the rank process first: its interpreter and torch import (seconds) overlap with
        connecting the log channel, writing the shard and the gang exchange. Returns the store port.

        Rank 0's process hosts the rendezvous (torch's TCPStore, Horovod's HTTP store, JAX's
        coordinator; with TensorFlow every rank its own server) on a socket bound and listening
        now: its port is known before torch is imported, and peers that connect early wait in the
        backlog.
        """
        spec, listener, port = self.spec, None, 0
        env = spec.rank_env(self.rank, self.gpus)
        try:
            if (self.rank == 0 and spec.barrier) or self.backend.every_rank_listens:  # plain: the driver's
                if self.backend.framework_rebinds_port:  # closed, then bound again: no race for it
                    listener = network.reserve_port(self.address)
                else:
                    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    listener.bind((self.address, 0))  # the address the peers are given
                    listener.listen(1024)
                port = listener.getsockname()[1]
                env[protocol.STORE_FD_ENV] = str(listener.fileno())
            warm = spec.warm_ranks and self.backend.warm_ranks and warm_pool.enabled()
            pool = warm_pool.Pool.of(env, self.backend.name, self.gang.pool_anchor()) if warm else None
            self.process = RankProcess(
                self.rank, self.workdir, env, (listener.fileno(),) if listener else (), self.cwd, pool
            )
        finally:
            if listener is not None:  # the rank process holds its own copy
                self.replacement.keep_listener(listener)
        self.replacement.arm(self.process)
        if self.rank == 0 and spec.roles is not None:  # the servers stop once its function returns
            self.process.on_returned = lambda: self._report(protocol.FRAME_RETURNED)
        if spec.channel is not None:
            self._connect_driver()
        log_path = (
            os.path.join(spec.logs.directory, f"rank{self.rank}-attempt{spec.attempt}-{spec.run_id}.log")
            if spec.logs.directory
            else None
        )
        self.watch_args = dict(
            forward=self.rank in spec.logs.ranks,
            client=self.client,
            echo=self.gang.echo_output and spec.echo,  # a Spark task: every line into the executor's log
            log_path=log_path,
        )
        self.process.watch(**self.watch_args)
        if self.kept_cwd and self.member == 0:
            self._report(
                protocol.FRAME_LINE,
                stream="log",
                text=f"{protocol.WORKDIR_MARK}{self.address}: {self.cwd} "
                + ("(removed after the run)" if spec.workdir.clean else "(kept after the run)"),
            )
        return port

    def _connect_driver(self) -> None:
        """The log channel to the driver (also the exchange's, with ``exchange="driver"``)."""
        spec = self.spec
        try:
            retry = min(spec.timeouts.start or 30.0, 30.0)  # a flooded driver evicts waiting handshakes
            client = LogClient(
                *spec.channel,
                spec.secret,
                timeout=5.0,
                retry_for=retry,
                on_frame=self.replies.on_frame,  # the driver's answer at the exchange
                on_close=self.replies.on_close,
            )
            self.client = Outbox(client)  # the rank's lines never wait on a slow driver
        except OSError as exc:  # unreachable (a remote Connect client, a firewall): no live logs
            self.client, self.driver_error = None, f"{type(exc).__name__}: {exc}"

    def begin(self, local_rank: int, message: bytes) -> None:
        """The rank's place on its host and its start message (the address exchange's answer):
        sent now, and kept for a rank started in its place; ``start_timeout`` counts from here."""
        self.local_rank, self.start_message = local_rank, message
        self.send_start(message)
        self.started = time.monotonic()  # the data phase before this is bounded apart

    def send_start(self, message: bytes) -> None:
        """Give the rank its start message; a rank that already died is reported as itself."""
        try:
            self.process.send_start(message)
        except OSError:  # BrokenPipeError: it ended before reading its start message
            code = self.process.wait_exit()
            raise self.fail(f"rank {self.rank} {exit_text(code)} before it started", code) from None

    def await_rendezvous(self) -> None:
        """Wait until the rank joins the rendezvous (or ends); fail it after ``start_timeout``."""
        spec = self.spec
        # one rank has no peer to wait for: a function that never distributes (one process on
        # several GPUs) is not a rank stuck before the rendezvous
        bounded = spec.timeouts.start and spec.world_size > 1
        deadline = self.started + spec.timeouts.start if bounded else None
        ev = self.process.wait_event(protocol.EVENT_RENDEZVOUS, deadline, self.cancelled)
        if ev is None and self.process.running and not self.cancelled():
            self.process.kill()
            self.process.join_output()
            call = (spec.roles is not None and self.backend.roles_start_call) or self.backend.start_call
            raise self.fail(
                f"{self.name} did not reach the rendezvous ({call}) "
                f"within start_timeout={spec.timeouts.start}s",
                None,
                "rendezvous",
            )
        if ev is not None:
            self._report(protocol.FRAME_RENDEZVOUS, host=self.address, task=self.gang.task_id())

    @property
    def _returns(self) -> bool:
        roles = self.spec.roles  # a server runs no function: it returns nothing
        return self.rank == 0 or (self.spec.return_all and (roles is None or roles.runs(self.rank)))

    def _no_result(self) -> bool:
        return self._returns and not os.path.exists(os.path.join(self.workdir, protocol.RESULT_FILE))

    def await_exit(self) -> None:
        code = self.process.wait_exit(self.cancel)
        while code is not None and self.replacement.replaceable(self.process, code, self.cancelled()):
            code = self._replaced(code)  # lost inside elastic.run: the others go on
        if protocol.EVENT_LEAVE in self.process.seen:  # left its decommissioned executor at a commit
            raise protocol.LeftOnNotice(
                f"{self.name} left its decommissioned executor at commit "
                f"{self.process.seen[protocol.EVENT_LEAVE].get('commits')}: Spark runs this task again "
                "on another executor, where a new rank joins the others"
            )
        if protocol.EVENT_OVER in self.process.seen:  # a new rank, joining after the others finished
            self.over = True
            return
        roles = self.spec.roles
        # a lost worker's work goes to the others; its task waits for the driver's stop (needs the channel)
        if code and roles is not None and roles.survives(self.rank) and self.client and not self.cancelled():
            code = self._lost_server(code)
        if code is None:
            raise self.fail(f"{self.name} was stopped because the run was cancelled", None, "cancelled")
        if code != 0 or self._no_result():  # sys.exit(0) / os._exit(0) inside the function too
            early = self._no_result() and (code == 0 or self.process.called_exit)
            raise self.fail(f"{self.name} {exit_text(code)}{' before returning a result' * early}", code)
        # code 0 without the function returning (sys.exit(0) / os._exit(0) inside it): no failure
        # of its own, but if the others then fail waiting for it, the driver names it as the cause
        self.left_early = not self.process.returned

    def _lost_server(self, code: int) -> Optional[int]:
        """A worker of a run with roles ended: the chief's coordinator runs its work on the other
        workers, so the task says so and waits for the run's end (the driver's stop) instead of
        failing the run; 0 then, None if the run was cancelled meanwhile."""
        self.process.join_output()
        self._report(
            protocol.FRAME_LINE,
            stream="log",
            text=f"[sparkml_dist] {self.name} {exit_text(code)}: the chief's coordinator runs its work on "
            "the other workers; the run goes on without it",
        )
        while not self.replies.stopped.wait(0.2):
            if self.cancelled():
                return None
        return 0

    def _replaced(self, code: int) -> Optional[int]:
        """Start the rank again in place of the one that ended with ``code`` and watch it as the
        first (its rendezvous, its exit); what it exits with."""
        self.process, line = self.replacement.take(self.process, code)
        self._report(protocol.FRAME_LINE, stream="log", text=line)
        self.process.watch(**self.watch_args)
        self.started = time.monotonic()
        self.send_start(self.start_message)
        self.await_rendezvous()
        return self.process.wait_exit(self.cancel)

    def result(self) -> Iterator[pa.RecordBatch]:
        """The result as chunk rows (rank 0, or every rank with ``return_all``)."""
        if self.over:  # a new rank that found the training over: no result (rank 0's is then missing)
            return
        if self._returns:
            path = os.path.join(self.workdir, protocol.RESULT_FILE)
            size = os.path.getsize(path)
            if size > self.spec.max_result_bytes:
                raise self.fail(
                    f"the result of rank {self.rank} is {size} bytes, more than the driver accepts "
                    f"(spark.driver.maxResultSize = {self.spec.max_result_bytes} bytes). Write large "
                    "results to storage (e.g. sparkml_dist.collection.ModelStore or torch.save to "
                    "a shared path) and return the path instead.",
                    0,
                    "result",
                )
            with open(path, "rb") as fh:
                yield collection.encode_bytes(self.rank, 0, fh.read())
        left = {"left": True} if self.left_early else {}
        self._report(protocol.FRAME_DONE, lines=self._lines_posted(), **left)

    def cleanup(self) -> None:
        self.replacement.close()  # the processes of ranks lost and replaced, a listening socket kept
        if self.process is not None:
            self.process.close()
        if self.client is not None:
            self.client.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def supervise(
    gang, batches: Iterable[pa.RecordBatch], spec: TaskSpec, cancel: Optional[threading.Event] = None
) -> Iterator[pa.RecordBatch]:
    """Run this task's ranks (one, or one per GPU it holds); yields their results as chunk rows
    (rank 0's, or every rank's).

    ``cancel`` (local mode) stops the ranks when set; under Spark the task itself is killed.
    """
    members: List[_RankTask] = []
    try:
        for j in range(spec.ranks_per_task):
            members.append(_RankTask(gang, spec, cancel, j))
        ports = [m.start() for m in members]
        envs, rows = _feed(members, batches)
        for m, n in zip(members, rows):
            m.rows = n
        replace.keep_rows(members)
        starts = exchange(members, ports, envs)
        if starts is None:  # started again after the others finished (executor_loss="replace")
            return
        for m, (local_rank, message) in zip(members, starts):
            m.begin(local_rank, message)
        await_all(members, cancel)
        if spec.workdir.clean and members[0].kept_cwd:
            clean_work_dir(members)
        for m in members:
            yield from m.result()
    finally:
        for m in members:
            m.cleanup()


def barrier_task(batches: Iterable[pa.RecordBatch], spec: TaskSpec) -> Iterator[pa.RecordBatch]:
    """The mapInArrow function (``barrier=spec.barrier``): one task per partition, running its rank(s)."""
    from .gangs import PlainSparkGang, SparkGang

    yield from supervise(SparkGang() if spec.barrier else PlainSparkGang(), batches, spec)
