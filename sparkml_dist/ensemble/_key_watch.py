"""A key's fit bounded in time: the fits run in a child process that the task watches.  [executor]

With ``keyTimeout`` (:class:`~sparkml_dist.ensemble.GroupedTrainer`) or ``key_timeout``
(:func:`~sparkml_dist.ensemble.train_per_group`), each fitting task starts one child Python
(``python -m sparkml_dist.ensemble._key_watch``) and hands it one key at a time: the key's rows as
Arrow IPC, its result back pickled, over the child's own pipes (nothing else reads or writes
them; what the fit prints goes to the task's stderr).  A fit still running when its time is up is
stopped by killing the child (SIGKILL: a fit stuck in C code, or holding the GIL, stops too), and
the key fails with "its fit ran past keyTimeout": under ``onError="skip"`` its row says so and the
next keys go on in a new child; under ``"raise"`` the fit fails naming the key.  The child starts
once per task (its imports: about a second) and again after each timeout; the timeout counts the
fit only, not the child's start.

Example (what :func:`~._fit_task.fit_groups` does)::

    with Watched(spec) as watched:
        out = watched.fit(group, key, parts)    # _one's result, or the timeout's
"""

from __future__ import annotations

import os
import pickle
import selectors
import struct
import subprocess
import sys
import time
from typing import Any, List, Optional

import pyarrow as pa

from .. import collection, serialization

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
            [sys.executable, "-m", "sparkml_dist.ensemble._key_watch"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
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
            self._child.kill()
            self._child.wait()
            self._child = None

    def fit(self, group: int, key: Any, parts: List[pa.RecordBatch]) -> Any:
        """What :func:`~._fit_groups._one` returns for this key, from the child, or the timeout's
        error (the child killed)."""
        rows = sum(b.num_rows for b in parts)
        if self._child is None:
            self._child = self._start()
        _write(self._child.stdin, pickle.dumps((group, key, _ipc(parts)), protocol=5))
        answer = self._answer()
        if answer not in (None, DIED):
            return serialization.loads(answer)
        code = self._child.poll()
        self._stop()
        stopped = f"its fit ran past keyTimeout={self.timeout:g}s and was stopped (its process killed)"
        died = f"the process fitting it died (exit code {code}); its stderr is in the executor's log"
        why = f"{self.spec.what} {key!r} ({rows} rows): {stopped if answer is None else died}"
        if self.spec.on_error == "raise":
            return collection.encode_error(group, f"fitting {why}", tb="")
        from ._fit_groups import GroupResult

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


def main() -> None:
    """The child: the spec once, then one key at a time until its input closes."""
    frames = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what the fit prints goes to stderr, never into the answers
    sys.stdout = sys.stderr
    from ._fit_groups import Clone, Template, _one

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
        parts = list(pa.ipc.open_stream(data))
        _write(frames, serialization.dumps(_one(spec, loaded, group, key, parts)))


if __name__ == "__main__":
    main()
