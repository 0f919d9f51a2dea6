"""Progress bars for jobs of many units (trials, search fits).  [anywhere]

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
from typing import Any, Iterator, Optional

FRAME_DONE = "done"  # a task -> the driver on the log channel: one more unit finished


class _Silent:
    n = 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def bar(total: int, desc: str, enabled: bool = True, unit: str = "it") -> Any:
    if not enabled:
        return _Silent()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency; a broken install stays quiet
        return _Silent()
    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True)


@contextlib.contextmanager
def fits(spark, total: int, desc: str, enabled: bool = True) -> Iterator[Optional[tuple]]:
    """A bar of ``total`` units and the ``(host, port, secret)`` tasks report to (None when off)."""
    if not enabled:
        yield None
        return
    from . import _spark_env
    from .channel import new_secret
    from .channel_server import listen

    progress = bar(total, desc, True, unit="fit")
    secret = new_secret()
    server = listen(
        secret,
        lambda message: progress.update(1) if message.get("type") == FRAME_DONE else None,
        _spark_env.driver_host(spark),
    )
    try:
        yield (server.address, server.port, secret)
    finally:
        server.close()
        progress.close()


class Reporter:
    """Executor side of :func:`fits`: ``report()`` after each unit (does nothing without a channel)."""

    def __init__(self, channel: Optional[tuple]) -> None:
        self._channel = channel
        self._client = None

    def __enter__(self) -> "Reporter":
        if self._channel is not None:
            from .channel import LogClient

            with contextlib.suppress(OSError):
                self._client = LogClient(*self._channel, timeout=5.0, retry_for=5.0)
        return self

    def __call__(self) -> None:
        if self._client is not None:
            self._client.send({"type": FRAME_DONE})

    def __exit__(self, *exc) -> None:
        if self._client is not None:
            self._client.close()
