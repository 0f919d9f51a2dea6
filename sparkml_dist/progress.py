"""Progress on long work: one line per phase, and bars for jobs of many units.  [anywhere]

:func:`phase` says what a fit or a run is doing and how long it took, one line each
("sparkml_dist: fitting 16 members in 16 tasks ... 4.2 s"), through the ``sparkml_dist.progress``
logger, which prints to stderr (a notebook cell's output) unless you configure it yourself or set
``SPARKML_DIST_PROGRESS=0``::

    with phase("checking 300,000 rows"):
        ...

``bar(total, desc, enabled)`` is a ``tqdm.auto`` bar (a widget in a notebook, a line in a
terminal), or a silent stand-in when ``enabled`` is False or tqdm is missing.  Updates are
thread-safe (tqdm's own lock).

For units finishing inside one Spark job (a search's fits), :func:`fits` opens a bar and an
authenticated channel (:mod:`sparkml_dist.channel`) and yields its address; each task's
:class:`Reporter` ticks the bar as its units finish.  Progress is best effort: a task that cannot
reach the driver still runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from typing import Any, Iterator, Optional

FRAME_DONE = "done"  # a task -> the driver on the log channel: one more unit finished


PROGRESS_ENV = "SPARKML_DIST_PROGRESS"
log = logging.getLogger("sparkml_dist.progress")


def _said() -> logging.Logger:
    """The progress logger, printing bare lines to stderr unless the user configured logging for
    it (or the package) or turned progress off."""
    if os.environ.get(PROGRESS_ENV, "1") == "0":
        log.disabled = True
        return log
    if not log.handlers and not logging.getLogger("sparkml_dist").handlers and log.level == logging.NOTSET:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("sparkml_dist: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


@contextlib.contextmanager
def phase(what: str) -> Iterator[None]:
    """One line when ``what`` starts and its time when it ends (its failure says so too)."""
    said = _said()
    said.info("%s ...", what)
    started = time.perf_counter()
    try:
        yield
    except BaseException:
        said.info("%s: stopped after %.1f s", what, time.perf_counter() - started)
        raise
    said.info("%s: %.1f s", what, time.perf_counter() - started)


class _Silent:
    n = 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def bar(total: int, desc: str, enabled: bool = True, unit: str = "it", delay: float = 0.0) -> Any:
    """``delay``: seconds before the bar first shows (work done sooner shows none)."""
    if not enabled:
        return _Silent()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency; a broken install stays quiet
        return _Silent()
    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, delay=delay)


@contextlib.contextmanager
def fits(
    spark, total: int, desc: str, enabled: bool = True, *, tasks: Optional[int] = None, unit: str = "fit",
    delay: float = 0.0,
) -> Iterator[Optional[tuple]]:  # fmt: skip
    """A bar of ``total`` units and the ``(host, port, secret)`` tasks report to (None when off).
    ``tasks``: how many tasks report (default: one per unit); ``delay``: as for :func:`bar`."""
    if not enabled or os.environ.get(PROGRESS_ENV, "1") == "0":
        yield None
        return
    from . import _spark_env
    from .channel import new_secret
    from .channel.server import listen

    progress = bar(total, desc, True, unit=unit, delay=delay)

    def done(message: dict) -> None:
        n = message.get("n", 1)
        if message.get("type") == FRAME_DONE and isinstance(n, int) and 0 < n <= total:
            progress.update(n)

    secret = new_secret()
    server = listen(
        secret,
        done,
        _spark_env.driver_host(spark),
        expected=tasks or total,  # the reporting tasks: their handshakes may all wait at once
    )
    try:
        yield (server.address, server.port, secret)
    finally:
        server.close()
        progress.close()


class Reporter:
    """Executor side of :func:`fits`: ``report()`` after each unit (does nothing without a channel);
    units finishing within :data:`EVERY` seconds of the last report go in one message."""

    EVERY = 0.25

    def __init__(self, channel: Optional[tuple]) -> None:
        self._channel = channel
        self._client = None
        self._pending, self._last = 0, 0.0

    def __enter__(self) -> "Reporter":
        if self._channel is not None:
            from .channel import LogClient

            with contextlib.suppress(OSError):
                self._client = LogClient(*self._channel, timeout=5.0, retry_for=5.0)
        return self

    def __call__(self, n: int = 1) -> None:
        if self._client is None:
            return
        self._pending += n
        now = time.monotonic()
        if now - self._last >= self.EVERY:
            self._flush(now)

    def _flush(self, now: float) -> None:
        if self._pending:
            self._client.send({"type": FRAME_DONE, "n": self._pending})
        self._pending, self._last = 0, now

    def __exit__(self, *exc) -> None:
        if self._client is not None:
            self._flush(time.monotonic())
            self._client.close()
