"""What went wrong in a run, told once and right.  [driver]

:class:`Monitor` is the driver's view of one attempt, fed by the log channel: streamed lines, ranks
that reached the rendezvous or finished, and failure reports, from which it picks the root cause (a
rank that failed by itself, not one that only lost its peer).  :func:`translate` turns whatever
Spark raised into our errors; :func:`restart_verdict` and :func:`final_error` decide and tell when
restarts stop.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from ..errors import InsufficientResourcesError, SparkMLDistError, WorkerError, missing_module_hint
from . import backends, protocol
from .backends import Backend
from .peer_exchange import Announces

FAILURE_GRACE_S = 1.0  # after a first failure report, how long to wait for the others
# ... and while every report so far only says a peer went away: the rank that went away is still
# exiting (its atexit handlers, a loaded machine) and its report, the root cause, is on its way
SYMPTOM_GRACE_S = 5.0
_EXECUTOR_LOST = re.compile(r"ExecutorLostFailure \(executor (\S+) exited[^)]*\) Reason: ([^\n]*)")
_TASK_FAILED_TIMES = re.compile(r"Task \S+ in stage \S+ failed (\d+) times")
_SLOT_ERRORS = (
    "requires more slots than the total number of slots",
    "barrier stage that requires more slots",
)


def _what_else(failure: dict) -> str:
    """A failure after the root cause, briefly: "rank 2 (exited with code 1)", or with a role's
    label (runner.roles) "rank 2 (worker 1): exited with code 1"."""
    rest = str(failure.get("message", "")).split(" ", 2)[-1]
    if rest.startswith("(") and ") " in rest:
        label, _, rest = rest.partition(") ")
        return f"rank {failure['rank']} {label}): {rest}"
    return f"rank {failure['rank']} ({rest})"


class Monitor:
    """Driver-side view of one attempt, fed by the log channel (:meth:`on_message`)."""

    def __init__(
        self,
        world_size: int,
        sink: Callable[[str], Any],
        backend: Optional[Backend] = None,
        tasks: Optional[int] = None,
    ) -> None:
        self.world_size = world_size
        self.tasks = world_size if tasks is None else tasks  # barrier tasks (a task may run several ranks)
        self.backend = backend or backends.get("torch")
        self._sink = sink
        self.on_metrics: Callable[[Dict[str, Any], Optional[int]], Any] = lambda metrics, step: None
        self.on_timing: Callable[[Any, Dict[str, Any]], Any] = lambda rank, summary: None
        # a rank reached the rendezvous: (rank, its frame, its task's reply channel or None)
        self.on_rendezvous: Callable[[Any, Dict[str, Any], Any], Any] = lambda rank, msg, send: None
        self.on_returned: Callable[[Any], Any] = lambda rank: None  # with roles: rank 0's function returned
        # whether the executor of one of these ranks has left Spark (no report will come from them)
        self.executor_gone: Callable[[List[Any]], bool] = lambda ranks: False
        self._lock = threading.Lock()
        self.reached: set = set()
        self.hosts: Dict[int, str] = {}  # rank -> the address it announced at the rendezvous
        self.finished: set = set()
        self.left: set = set()  # ranks that exited 0 before their function returned (sys.exit, os._exit)
        self.failures: List[dict] = []
        self._first_failure_at: Optional[float] = None
        self._held: Dict[Any, List[str]] = {}  # rank -> the traceback it is printing, held back
        self._in_block: set = set()
        self.stuck: Optional[str] = None  # the latest "stuck collective" line (stall_watch), for the error
        self._workdirs: Dict[str, List[str]] = {}  # a kept directory (path, fate) -> the hosts saying it
        self.announces = Announces(self.tasks)  # the tasks' exchange through the driver (peer_exchange)

    @property
    def failure(self) -> Optional[dict]:
        return self.failures[0] if self.failures else None

    def add_failure(self, detail: dict) -> None:
        with self._lock:
            if all(f.get("rank") != detail.get("rank") for f in self.failures):
                self.failures.append(detail)
                if self._first_failure_at is None:
                    self._first_failure_at = time.monotonic()

    def wait_for_reports(
        self, grace: float = FAILURE_GRACE_S, symptom_grace: float = SYMPTOM_GRACE_S
    ) -> None:
        """Give the other ranks ``grace`` seconds to report, so the root cause can be picked; up to
        ``symptom_grace`` while every report only says that a peer went away."""
        while self._first_failure_at is not None:
            if len(self.failures) + len(self.finished) >= self.world_size:
                return
            with self._lock:
                symptoms = all(protocol.is_symptom(f, self.backend.peer_lost) for f in self.failures)
                spoke = {f.get("rank") for f in self.failures} | self.finished
            if time.monotonic() >= self._first_failure_at + (symptom_grace if symptoms else grace):
                return
            if symptoms and self.executor_gone(sorted(r for r in self.reached if r not in spoke)):
                return  # the silent ranks' executor is gone: their reports will never come
            time.sleep(0.05)

    def on_message(self, msg: Dict[str, Any], send: Optional[Callable[[dict], None]] = None) -> None:
        kind, rank = msg.get("type"), msg.get("rank")
        if kind == protocol.FRAME_ANNOUNCE:
            self.announces.add(msg, send)
        elif kind == protocol.FRAME_LINE:
            with self._lock:
                self._line(rank, msg.get("stream"), str(msg.get("text", "")))
        elif kind == protocol.FRAME_RENDEZVOUS:
            self.reached.add(rank)
            if isinstance(msg.get("host"), str):
                self.hosts[rank] = msg["host"]
            self.on_rendezvous(rank, msg, send)
        elif kind == protocol.FRAME_DONE:
            self.finished.add(rank)
            if msg.get("left"):
                self.left.add(rank)
        elif kind == protocol.FRAME_RETURNED:
            self.on_returned(rank)
        elif kind == protocol.FRAME_FAILED:
            self.add_failure(msg)
        elif kind == protocol.FRAME_TIMING:
            self.on_timing(rank, msg)
        elif kind == protocol.FRAME_METRICS and rank == 0 and isinstance(msg.get("metrics"), dict):
            step = msg.get("step")
            self.on_metrics(msg["metrics"], step if isinstance(step, int) else None)

    def _line(self, rank: Any, stream: Optional[str], text: str) -> None:
        """A streamed line.  A traceback a rank prints is held back: if the rank goes on printing, it
        was a handled error and is shown then; if the run fails, the error shows the root cause's
        (:meth:`end`) and a peer's secondary "connection closed" traceback never reaches the screen."""
        if stream == "log" and text.startswith(protocol.STUCK_MARK):
            self.stuck = text[len(protocol.STUCK_MARK) :]
        if stream == "log" and text.startswith(protocol.WORKDIR_MARK) and ": " in text:
            host, where = text[len(protocol.WORKDIR_MARK) :].split(": ", 1)
            seen = self._workdirs.setdefault(where, [])
            seen.append(host)
            if len(seen) > 1:  # one line per directory, not one per task: the others counted at the end
                return
        if stream == "stderr" and text.startswith("Traceback (most recent call last)"):
            self._in_block.add(rank)
        if rank in self._in_block:
            self._held.setdefault(rank, []).append(text)
            if text and not text[0].isspace() and not text.startswith(("Traceback", "During handling")):
                self._in_block.discard(rank)  # the exception's own line ends the block
            return
        for held in self._held.pop(rank, []):
            self._sink(f"[rank {rank}] {held}\n")
        self._sink(f"[rank {rank}] {text}\n")

    def end(self, ok: bool) -> None:
        """The attempt ended: held tracebacks are shown after a success, dropped after a failure
        (its error carries the root cause's traceback)."""
        with self._lock:
            held, self._held = self._held, {}
            self._in_block.clear()
            for where, hosts in self._workdirs.items():
                if len(hosts) > 1:
                    names = ", ".join(hosts[1:6]) + (", ..." if len(hosts) > 6 else "")
                    self._sink(
                        f"sparkml_dist: the same working directory on {len(hosts) - 1} more task(s) "
                        f"({names}): {where}\n"
                    )
            self._workdirs.clear()
            if ok:
                for rank, lines in held.items():
                    for text in lines:
                        self._sink(f"[rank {rank}] {text}\n")

    def root_cause(self) -> dict:
        """The failure that caused the others: not a lost-peer symptom, then the earliest."""
        return protocol.root_cause(self.failures, self.backend.peer_lost)

    def worker_error(self, extra: str = "", lost_host: Optional[str] = None) -> WorkerError:
        d = self.root_cause() if self.failures else {}
        message = d.get("message", "a rank failed")
        if d.get("phase") in ("rendezvous", "start"):
            time.sleep(0.5)  # let the other ranks' start-timeout reports arrive
            missing = sorted(set(range(self.world_size)) - self.reached)
            if missing:
                message = (
                    f"ranks {missing} did not reach the rendezvous ({self.backend.start_call}) "
                    f"within start_timeout; {message}"
                )
        others = [f for f in self.failures if f is not d]
        if others:
            message += "; then " + ", ".join(_what_else(f) for f in sorted(others, key=lambda f: f["rank"]))
        rank = d.get("rank")
        if self.left and (not d or protocol.is_symptom(d, self.backend.peer_lost)):
            left = sorted(self.left)  # the others only lost their peer: the rank that left is the cause
            message = (
                f"rank{'s' * (len(left) > 1)} {', '.join(map(str, left))} left the run: exited with code 0 "
                "before its function returned (sys.exit or os._exit inside it) while the other ranks "
                f"waited for it in a collective; then {message}"
            )
            rank = left[0]
        finished = sorted(self.finished - self.left)
        if finished:
            message += f" (ranks {finished} had already finished)"
        lost_host = lost_host or d.get("lost_host")  # a detail of the driver's own (a lost executor)
        if not d or protocol.is_symptom(d, self.backend.peer_lost):
            message += self._silent_hosts()  # only a rank that lost its peers points at a host
            lost_host = lost_host or self._silent_place()
        if self.stuck:
            message += f" (before it, the stuck collective: {self.stuck})"
        message += extra
        tail = "\n".join(d.get("tail") or [])
        message += missing_module_hint(tail, d.get("python"))
        return WorkerError(
            message,
            rank=rank,
            exit_code=d.get("exit_code"),
            worker_traceback=tail,
            lost_host=lost_host,
        )

    def _silent_place(self) -> Optional[str]:
        """Where the ranks that said nothing ran, when the others only lost them: their task died
        with its process (an executor or a host gone, not a bug: :func:`restart_verdict`)."""
        spoke = {f.get("rank") for f in self.failures} | self.finished
        silent = [r for r in sorted(self.reached) if r not in spoke]
        if not silent or not self.failures:
            return None
        return ", ".join(sorted({f"rank {r}'s executor on {self.hosts.get(r, '?')}" for r in silent}))

    def _silent_hosts(self) -> str:
        """The hosts none of whose ranks said a word since the rendezvous (neither failed nor
        finished): a host that died or was cut off cannot report, its peers only time out."""
        spoke = {f.get("rank") for f in self.failures} | self.finished
        heard = {self.hosts.get(r) for r in spoke}
        silent = [r for r in sorted(self.hosts) if r not in spoke and self.hosts[r] not in heard]
        if not silent or not self.failures:
            return ""
        lost = sorted({self.hosts[r] for r in silent})
        return (
            f"; no word from rank{'s' * (len(silent) > 1)} {', '.join(map(str, silent))} on "
            f"{', '.join(lost)}: that host stopped answering (down, or cut off from the other "
            "hosts and the driver)"
        )


def results_too_large(what: str) -> WorkerError:
    """The ranks' results together are more than the driver accepts (``return_all=True``: every
    rank's).  Each rank's own result is checked by its task; their total by Spark itself as they
    arrive (``spark.driver.maxResultSize``), or by the local launcher: no round among the tasks
    for it (Spark's barrier ``allGather`` polls once a second, a second off every run)."""
    return WorkerError(
        f"the ranks' results are more than the driver accepts ({what}). Return less from each rank "
        "(return_all=True returns every rank's), or write results to storage (e.g. "
        "sparkml_dist.collection.ModelStore) and return the paths.",
        exit_code=0,
    )


_RESULTS_OVER = re.compile(r"Total size of serialized results of .*?maxResultSize \([^)]*\)")


def translate(exc: BaseException, monitor: Monitor) -> BaseException:
    """What Spark raised for a barrier job, as the error a user can act on."""
    text = str(exc)
    over = _RESULTS_OVER.search(text)
    if over:
        return results_too_large(f"Spark: {over.group(0)}")
    detail = protocol.parse_failure(text)
    if detail is not None:
        monitor.add_failure(detail)
        return monitor.worker_error()
    lost = _EXECUTOR_LOST.search(text)
    if lost and not monitor.failures:  # the ranks that saw it may still be reporting
        end = time.monotonic() + 2 * FAILURE_GRACE_S
        while not monitor.failures and time.monotonic() < end:
            time.sleep(0.05)
        monitor.wait_for_reports()
    if lost:
        executor, reason = lost.group(1), lost.group(2).strip()
        times = _TASK_FAILED_TIMES.search(text)  # plain tasks: Spark's retries of one task ran out
        if times:
            reason += f"; Spark ran that task {times.group(1)} times, its limit (spark.task.maxFailures)"
        if monitor.failures and not all(
            protocol.is_symptom(f, monitor.backend.peer_lost) for f in monitor.failures
        ):  # a rank failed by itself: its code, not the machine, is the cause
            return monitor.worker_error(f"; Spark lost executor {executor}: {reason}")
        if monitor.failures:  # the ranks only lost their peers on the lost machine
            return monitor.worker_error(f"; Spark lost executor {executor}: {reason}", lost_host=executor)
        return WorkerError(
            f"Spark lost executor {executor} running ranks ({reason}) and no rank reported why: its "
            "host died or was cut off",
            lost_host=executor,
        )
    if any(s in text for s in _SLOT_ERRORS):
        world, tasks = monitor.world_size, monitor.tasks
        spark_line = next((ln.strip() for ln in text.splitlines() if "slots" in ln), "")
        return InsufficientResourcesError(
            f"np={world} ranks need {tasks} barrier task(s) with free slots at once and the cluster "
            f"has fewer (Spark: {spark_line[:300]}). Lower np or add executors."
        )
    if isinstance(exc, SparkMLDistError):
        return exc
    return WorkerError(
        f"the barrier job failed: {type(exc).__name__}: {text.splitlines()[0][:500] if text else ''}",
        worker_traceback=text[-5000:],
    )


KILLED_FROM_OUTSIDE = (-9, -15)  # exit codes of a process killed by SIGKILL / SIGTERM


def signature(exc: WorkerError) -> tuple:
    """What makes two failures 'the same': rank, exit code and the last line the rank printed."""
    lines = [ln.strip() for ln in (exc.worker_traceback or "").splitlines() if ln.strip()]
    return exc.rank, exc.exit_code, lines[-1] if lines else str(exc).splitlines()[0]


def cause(exc: WorkerError) -> str:
    """One line for an attempt: what happened, and the last line the rank printed."""
    first = str(exc).splitlines()[0]
    last = signature(exc)[2]
    return first if last in first else f"{first} [{last}]"


def restart_verdict(failures: List[WorkerError], max_restarts: int) -> str:
    """Why to stop restarting now ('' to go on).  A lost machine is never 'the same failure again':
    two hosts lost one after the other look alike and are no bug of the function."""
    if len(failures) > max_restarts:
        return f"max_restarts={max_restarts} used up"
    lost = any(getattr(f, "lost_host", None) for f in failures[-2:])
    # killed from outside (the OOM killer, a preemption, an operator: SIGKILL, SIGTERM) at whatever
    # point it was: no bug of the function either, however alike two such deaths look
    killed = any(getattr(f, "exit_code", None) in KILLED_FROM_OUTSIDE for f in failures[-2:])
    if len(failures) >= 2 and not (lost or killed) and signature(failures[-1]) == signature(failures[-2]):
        return "the same failure repeated identically (a bug in the function, not a lost machine)"
    return ""


def final_error(failures: List[WorkerError], why: str) -> WorkerError:
    """The error that ends a run after restarts: every attempt's cause, the last one's details."""
    last = failures[-1]
    lines = "; ".join(f"attempt {i + 1}: {cause(f)}" for i, f in enumerate(failures))
    return WorkerError(
        f"the run failed {len(failures)} times, restarts stopped ({why}): {lines}",
        rank=last.rank,
        exit_code=last.exit_code,
        worker_traceback=last.worker_traceback,
    )
