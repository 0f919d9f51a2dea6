"""RankProcess: one rank's child process, its output, its control events and its result.  [executor]

The barrier task (:mod:`sparkml_dist.runner.tasks.task`) starts one :class:`RankProcess`; three
reader threads cut its output into lines (:mod:`.output_lines`: progress bars as their latest
state, long lines cut), keep the last :data:`TAIL_LINES` (for failure reports), forward lines to the
driver when the rank is streamed, copy every line to the executor's stderr and ``log_dir``, and
queue its control events (``runner.protocol``); :meth:`RankProcess.kill` stops its process group.
"""

from __future__ import annotations

import collections
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Callable, Dict, List, Optional, Sequence

from ...channel import LogClient
from .. import protocol
from .output_lines import MAX_LINE, Lines
from .warm_pool import Pool
from .warm_rank import WarmProcess
from .workdirs import open_log

TAIL_LINES = 40


def exit_text(code: int) -> str:
    """How a process ended, in words ("exited with code 3", "was killed by signal 9 (SIGKILL)")."""
    if code < 0:
        try:
            return f"was killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# Runs beside each rank, in a session of its own: it reads the rank's pid (a line; a warm rank's
# comes once its pool forked it), waits for EOF on a pipe that only the task holds, then kills the
# rank's process group and every process whose environment carries the rank's token (what the rank
# started in sessions of their own, with setsid or daemonised, after their parent died), twice (a
# fork in between), and removes its work directory.  A task killed by Spark (a cancel, a timeout:
# the Python worker gets SIGKILL, no ``finally`` runs) thus leaves neither the processes its rank
# started (data loader workers, subprocesses) nor its files.
_REAPER = (
    'read -r p; cat >/dev/null; [ -n "$p" ] && kill -9 "-$p" 2>/dev/null; '  # dash: no -- for kill
    'for _ in 1 2; do for e in $(grep -lsxzF -- "$2" /proc/[0-9]*/environ); do '
    'p=${e#/proc/}; kill -9 "${p%/environ}" 2>/dev/null; done; done; rm -rf -- "$1"'
)


class RankProcess:
    """Start ``python -c RANK_ENTRY`` in ``cwd`` (default ``workdir``, the rank's private
    directory) with ``env``; watch it until it ends.

    ``pass_fds``: descriptors the child inherits (the control pipe's write end is added here).
    ``pool``: fork it from this warm pool (:mod:`.warm_pool`), else start it cold.  It starts at
    once; :meth:`watch` starts reading its output (meanwhile it waits in the pipes), so its slow
    start overlaps what the task does next.  Its process group and ``workdir`` end with the task.
    """

    def __init__(
        self,
        rank: int,
        workdir: str,
        env: Dict[str, str],
        pass_fds: Sequence[int] = (),
        cwd: Optional[str] = None,
        pool: Optional[Pool] = None,
    ) -> None:
        self.rank = rank
        # the last lines per stream: a failure report shows stdout's, then stderr's (the traceback),
        # so a chatty stdout read later than stderr cannot push the traceback out
        self._tails: Dict[str, "collections.deque[str]"] = {
            "stdout": collections.deque(maxlen=TAIL_LINES),
            "stderr": collections.deque(maxlen=TAIL_LINES),
        }
        self._events: "queue.Queue[dict]" = queue.Queue()
        self._forward, self._client, self._echo, self._log = False, None, False, None
        self.called_exit = False  # the function called sys.exit()
        self.returned = False  # the function returned (its result written): EVENT_DONE
        self.seen: Dict[str, dict] = {}  # the last control event of each name (EVENT_ELASTIC, ...)
        self.on_event: Callable[[dict], None] = lambda ev: None  # each control event, as it comes
        self.on_returned: Callable[[], None] = lambda: None  # EVENT_DONE, as it comes
        self._threads: List[threading.Thread] = []
        ctrl_r, ctrl_w = os.pipe()
        secret = uuid.uuid4().hex
        self._reaper_lock = threading.Lock()
        self._reaper_w = self._start_reaper(workdir, f"{protocol.TOKEN_ENV}={secret}")
        try:
            env = {**env, protocol.TOKEN_ENV: secret, protocol.CTRL_ENV: str(ctrl_w)}
            env.update({protocol.PARENT_ENV: str(os.getpid()), protocol.WORKDIR_ENV: workdir})
            # forked once the pool is ready; without one (or if it fails) started cold by a keeper;
            # it runs in cwd, the user's code's directory (the runner's files stay in workdir)
            self.proc = WarmProcess(pool, env, cwd or workdir, (ctrl_w, *pass_fds), self._tell_reaper)
        except BaseException:
            os.close(ctrl_r)
            self._close_reaper()
            raise
        finally:
            os.close(ctrl_w)
        self._ctrl_r = ctrl_r

    def _start_reaper(self, workdir: str, token: str) -> Optional[int]:
        if not os.path.exists("/bin/sh"):
            return None
        reap_r, reap_w = os.pipe()  # not inheritable: only this process holds the write end
        try:
            subprocess.Popen(
                ["/bin/sh", "-c", _REAPER, "sparkml_dist-reaper", workdir, token],
                stdin=reap_r,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError:
            os.close(reap_w)
            return None
        finally:
            os.close(reap_r)
        return reap_w

    def _tell_reaper(self, pid: int) -> None:
        with self._reaper_lock:
            if self._reaper_w is not None:
                try:
                    os.write(self._reaper_w, f"{pid}\n".encode())
                except OSError:  # the reaper is gone (killed with the task's group): nothing to tell
                    pass

    def _close_reaper(self) -> None:
        """The reaper now kills what the rank left running, and removes its files."""
        with self._reaper_lock:
            if self._reaper_w is not None:
                os.close(self._reaper_w)
                self._reaper_w = None

    def watch(
        self,
        forward: bool = False,
        client: Optional[LogClient] = None,
        echo: bool = False,
        log_path: Optional[str] = None,
    ) -> None:
        """Start the readers. ``forward``: stream stdout/stderr lines to ``client`` (lines sent with
        ``log_to_driver`` always go). Every line, streamed or not, also goes to this process's
        stderr with ``echo`` (a Spark task's: the executor log) and to ``log_path`` when given."""
        self._forward, self._client = forward, client
        self._echo = echo
        if log_path is not None:  # checked and opened 0600 (workdirs.open_log's rule)
            self._log = open_log(os.path.dirname(log_path) or ".", os.path.basename(log_path))
        self._threads = [
            threading.Thread(target=self._lines, args=(self.proc.stdout, "stdout"), daemon=True),
            threading.Thread(target=self._lines, args=(self.proc.stderr, "stderr"), daemon=True),
            threading.Thread(target=self._ctrl, args=(self._ctrl_r,), daemon=True),
        ]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ readers
    def _relay(self, stream: str, text: str) -> None:
        if stream == "log" and len(text) > MAX_LINE:  # log_to_driver text comes whole, not via Lines
            text = f"{text[:MAX_LINE]} [... {len(text) - MAX_LINE} more characters cut]"
        self._tails["stderr" if stream == "stderr" else "stdout"].append(text)
        if self._echo:
            sys.stderr.write(f"[rank {self.rank}] {text}\n")
        if self._log is not None:
            try:
                self._log.write(text + "\n")
            except (OSError, ValueError):  # a full disk or a closed file: logs are best effort
                pass
        if self._client is not None and (self._forward or stream == "log"):
            self._client.send(
                {"type": protocol.FRAME_LINE, "rank": self.rank, "stream": stream, "text": text}
            )

    def _lines(self, pipe, stream: str) -> None:
        lines = Lines(lambda text: self._relay(stream, text))
        for chunk in iter(lambda: pipe.read1(1 << 16), b""):
            lines.feed(chunk)
        lines.close()
        pipe.close()

    def _ctrl(self, fd: int) -> None:
        with os.fdopen(fd, "r") as fh:
            for ev in filter(None, map(protocol.parse_event, fh)):
                self.seen[str(ev.get("event"))] = ev
                self.on_event(ev)
                if ev.get("event") == protocol.EVENT_LOG:  # log_to_driver: streamed whatever log_ranks says
                    self._relay("log", str(ev.get("text", "")))
                elif ev.get("event") == protocol.EVENT_EXIT:
                    self.called_exit = True
                elif ev.get("event") == protocol.EVENT_DONE:
                    self.returned = True
                    self.on_returned()
                elif ev.get("event") == protocol.EVENT_METRICS:
                    if self._client is not None:
                        frame = {"type": protocol.FRAME_METRICS, "rank": self.rank}
                        self._client.send({**frame, "step": ev.get("step"), "metrics": ev.get("metrics")})
                elif ev.get("event") == protocol.EVENT_TIMING:
                    if self._client is not None:  # the rank's step clock so far: to the driver as it is
                        fields = {k: ev.get(k) for k in ("steps", "step_s", "data_s", "comm_s", "final")}
                        self._client.send({"type": protocol.FRAME_TIMING, "rank": self.rank, **fields})
                else:
                    self._events.put(ev)

    # ------------------------------------------------------------------ control
    def send_start(self, message: bytes) -> None:
        """Write the start message (:func:`protocol.start_message`) to the rank's stdin (once it runs)."""
        self.proc.wait_forked()
        self.proc.stdin.write(message)
        self.proc.stdin.flush()

    def wait_event(
        self, name: str, deadline: Optional[float], cancelled: Callable[[], bool] = lambda: False
    ) -> Optional[dict]:
        """The next control event ``name``; None once the process exited, ``deadline`` (a monotonic
        time) passed or ``cancelled()``."""
        while not cancelled():
            if self.proc.poll() is not None and self._events.empty():
                return None
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            try:
                ev = self._events.get(timeout=0.1 if left is None else min(0.1, left))
            except queue.Empty:
                continue
            if ev.get("event") == name:
                return ev
        return None

    def wait_exit(self, cancel: Optional[threading.Event] = None) -> Optional[int]:
        """Its exit code; if ``cancel`` came first (it is killed) 1 when its function raised, else None."""
        while self.proc.poll() is None:
            if cancel is None:
                self.proc.wait()
            elif cancel.wait(0.1) and self.proc.poll() is None:
                self.kill()
                return 1 if protocol.EVENT_RAISED in self.seen else None
        self.join_output()
        return self.proc.returncode

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def join_output(self, timeout: float = 2.0) -> None:
        """Wait (briefly) until the output the process wrote before ending has been read."""
        for t in self._threads:
            t.join(timeout)

    def lines(self) -> List[str]:
        """The last TAIL_LINES lines: stdout's, then up to 3/4 of them from stderr."""
        err = list(self._tails["stderr"])[-(TAIL_LINES * 3 // 4) :]
        out = list(self._tails["stdout"])[max(0, len(self._tails["stdout"]) - (TAIL_LINES - len(err))) :]
        return out + err

    def kill(self) -> None:
        """Kill the process group (the rank and whatever it started), then reap the rank."""
        if self.proc.poll() is None:
            self.proc.kill()  # not started yet: it never will be
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        self.join_output(0.5)
        self.proc.close()
        self._close_reaper()
        if self._log is not None:
            self._log.close()
        if not self._threads:  # never watched: the control pipe's read end is still ours
            os.close(self._ctrl_r)
        try:
            self.proc.stdin.close()
        except OSError:
            pass
