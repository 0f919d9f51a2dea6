"""A key's fit bounded in time: the fits run in a child process that the task watches.  [executor]

With ``keyTimeout`` (:class:`~sparkml_dist.ensemble.GroupedTrainer`) or ``key_timeout``
(:func:`~sparkml_dist.ensemble.train_per_group`), each fitting task starts one child Python
(``python -m sparkml_dist.ensemble.engine.key_watch``) and hands it one key at a time: the key's rows as
Arrow IPC, its result back pickled, over the child's own pipes (nothing else reads or writes
them; what the fit prints goes to the task's stderr).  A key trained from a stream (``stream=True``,
``streamAbove``) is fitted in the child too: its batches follow one frame each, as the task reads
them, so its rows are never held here either and its time counts from its first batch.  A fit
still running when its time is up is stopped by killing the child and everything it started (its
fit's subprocesses, a daemon that left for a session of its own: the child is their subreaper,
:mod:`sparkml_dist.host.processes`), with SIGKILL (a fit stuck in C code, or holding the GIL, stops
too), and the key fails with "its fit ran past keyTimeout": under ``onError="skip"`` its row says so
and the next keys go on in a new child; under ``"raise"`` the fit fails naming the key.  The child
starts once per task (its imports: about a second) and again after each timeout; the timeout counts
the fit only, not the child's start.

Example (what :func:`~.task.fit_groups` does)::

    with Watched(spec) as watched:
        out = watched.fit(group, key, parts)    # fit_one's result, or the timeout's
        out = watched.fit(group, key, stream, streamed=True)
"""

from __future__ import annotations

import os
import pickle
import selectors
import struct
import subprocess
import sys
import threading
import time
from typing import Any, Iterable, Iterator, List, Optional

import pyarrow as pa

from ... import collection, serialization
from ...host import processes

_HEAD = struct.Struct("<Q")
READY, DIED = b"ready", b""  # the child's first frame; what _answer says when it ended


def _write(stream, data: bytes) -> None:
    stream.write(_HEAD.pack(len(data)))
    stream.write(data)
    stream.flush()


def _read(stream) -> Optional[bytes]:
    head = stream.read(_HEAD.size)
    if len(head) < _HEAD.size:
        return None
    (size,) = _HEAD.unpack(head)
    data = stream.read(size)
    return data if len(data) == size else None


def _ipc(parts: List[pa.RecordBatch]) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, parts[0].schema) as writer:
        for batch in parts:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


class Watched:
    """The task's side: a child that fits keys, restarted after a timeout (see the module docstring)."""

    def __init__(self, spec: Any) -> None:
        self.spec, self.timeout = spec, float(spec.key_timeout)
        self._blob = serialization.dumps(spec)
        self._child: Optional[subprocess.Popen] = None

    def __enter__(self) -> "Watched":
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def _start(self) -> subprocess.Popen:
        child = subprocess.Popen(
            [sys.executable, "-m", "sparkml_dist.ensemble.engine.key_watch"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
            start_new_session=True,  # its fit's processes are its own: killed with it, not the task
        )
        _write(child.stdin, self._blob)
        if _read(child.stdout) != READY:  # its imports and the spec: not counted in any key's time
            child.kill()
            raise RuntimeError(
                f"the process that fits keys within keyTimeout did not start (exit {child.wait()})"
            )
        return child

    def _stop(self) -> None:
        if self._child is not None:
            processes.kill_tree(self._child.pid)  # and whatever its fit started, wherever it went
            self._child.wait()
            self._child = None

    def fit(self, group: int, key: Any, parts: Iterable[pa.RecordBatch], streamed: bool = False) -> Any:
        """What :func:`~.fitting.fit_one` returns for this key, from the child, or the timeout's
        error (the child and its processes killed).  ``streamed``: ``parts`` is the key's stream,
        sent a batch at a time while the child fits (its rows are counted as they pass)."""
        if self._child is None:
            self._child = self._start()
        feeder = None
        if streamed:
            _write(self._child.stdin, pickle.dumps((group, key, None), protocol=5))
            feeder = _Feeder(self._child.stdin, parts)
        else:
            parts = list(parts)
            _write(self._child.stdin, pickle.dumps((group, key, _ipc(parts)), protocol=5))
        answer = self._answer()
        if answer not in (None, DIED):
            if feeder is not None:
                feeder.finish()  # the child read the end of the stream before it answered
            return serialization.loads(answer)
        code = self._child.poll()
        self._stop()  # first: the feeder may be blocked writing to it
        rows = feeder.finish() if feeder is not None else sum(b.num_rows for b in parts)
        stopped = f"its fit ran past keyTimeout={self.timeout:g}s and was stopped (its processes killed)"
        died = f"the process fitting it died (exit code {code}); its stderr is in the executor's log"
        why = f"{self.spec.what} {key!r} ({rows} rows): {stopped if answer is None else died}"
        if self.spec.on_error == "raise":
            return collection.encode_error(group, f"fitting {why}", tb="")
        from .fitting import GroupResult

        return GroupResult(group, key, rows, error=why)

    def _answer(self) -> Optional[bytes]:
        """The child's answer; None when the time is up, :data:`DIED` when the child ended."""
        deadline = time.monotonic() + self.timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self._child.stdout, selectors.EVENT_READ)
            while not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    return None
        answer = _read(self._child.stdout)
        return DIED if answer is None else answer


class _Feeder:
    """A streamed key's batches written to the child, one frame each and an empty frame at the end,
    from a thread of its own (the task's main thread watches the time)."""

    def __init__(self, stdin, parts: Iterable[pa.RecordBatch]) -> None:
        self.stdin, self.parts, self.rows, self.stop = stdin, parts, 0, False
        self.thread = threading.Thread(target=self._run, daemon=True, name="sparkml_dist-key-feed")
        self.thread.start()

    def _run(self) -> None:
        try:
            for batch in self.parts:
                if self.stop:
                    return  # the child was stopped: what is left of the key is skipped by the task
                self.rows += batch.num_rows
                _write(self.stdin, _ipc([batch]))
            _write(self.stdin, b"")
        except (BrokenPipeError, OSError, ValueError):  # the child ended or was killed
            return

    def finish(self) -> int:
        """Rows sent; once the child answered or was stopped (the stream is the task's again)."""
        self.stop = True
        self.thread.join()
        return self.rows


def _frames(stream) -> Iterator[pa.RecordBatch]:
    """(in the child) a streamed key's batches, until the empty frame that ends them."""
    while True:
        data = _read(stream)
        if not data:
            return
        yield from pa.ipc.open_stream(data)


def main() -> None:
    """The child: the spec once, then one key at a time until its input closes."""
    processes.subreaper()  # what its fits leave orphaned stays below it, to be killed with it
    frames = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what the fit prints goes to stderr, never into the answers
    sys.stdout = sys.stderr
    from .fitting import Clone, Template, fit_one
    from .stream import Counted

    spec = serialization.loads(_read(sys.stdin.buffer))
    loaded = serialization.loads(spec.recipe.blob)
    if isinstance(spec.recipe, Clone):
        loaded = Template(loaded, spec.recipe.member)
    _write(frames, READY)
    while True:
        frame = _read(sys.stdin.buffer)
        if frame is None:
            return
        group, key, data = pickle.loads(frame)
        if data is None:  # a streamed key: its batches follow
            parts = Counted(_frames(sys.stdin.buffer))
        else:
            parts = list(pa.ipc.open_stream(data))
        _write(frames, serialization.dumps(fit_one(spec, loaded, group, key, parts)))


if __name__ == "__main__":
    main()
