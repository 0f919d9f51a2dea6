"""A rank that stops making progress says where it stands: the heartbeat of a stalled run.  [rank]

While the function runs, a thread samples the main thread's innermost Python frame every few
seconds. When it has not moved for a while — 60 s, or a quarter of ``collective_timeout`` when
that is shorter — the rank sends the driver one line (shown whatever ``log_ranks`` says), then
again at twice, four times ... that long, until it moves::

    [rank 0] at the same line for 60 s: train.py:42 in step, inside all_reduce (torch/distributed/...)

A rank waiting in a collective for a peer sits on the collective's line; the peer that does not say
so (or is stuck elsewhere) is the one to look at. A long call that is working (one large XGBoost
round, a slow read) is reported the same way, as where the rank is. A collective that never
completes still ends at ``collective_timeout`` with the rank's error. Sampling costs nothing in
the training loop: no hook runs in it. ``SPARKML_DIST_STALL_REPORT`` (seconds; 0 turns it off)
overrides the delay.

Example::

    watch(threading.get_ident(), send_log)   # before the user's function runs
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, Optional

from . import protocol

STALL_ENV = "SPARKML_DIST_STALL_REPORT"
DEFAULT_AFTER = 60.0


def delay() -> float:
    """Seconds without progress before the first report (0: never)."""
    raw = os.environ.get(STALL_ENV)
    if raw:
        try:
            return max(0.0, float(raw))
        except ValueError:
            return DEFAULT_AFTER
    collective = float(os.environ.get(protocol.TIMEOUT_ENV) or 0) or DEFAULT_AFTER * 4
    return min(DEFAULT_AFTER, collective / 4)


def watch(
    thread_id: int, send: Callable[[str], object], after: Optional[float] = None
) -> Optional[threading.Thread]:
    """Start the watcher of thread ``thread_id``; ``send(line)`` delivers a report."""
    after = delay() if after is None else after
    if after <= 0:
        return None
    t = threading.Thread(target=_loop, args=(thread_id, send, after), daemon=True, name="sparkml_dist-stall")
    t.start()
    return t


def _loop(thread_id: int, send: Callable[[str], object], after: float) -> None:
    poll = max(0.2, min(5.0, after / 4))
    place, since, report_at = None, time.monotonic(), after
    while True:
        time.sleep(poll)
        frame = sys._current_frames().get(thread_id)
        if frame is None:
            return  # the thread ended
        now = (id(frame), frame.f_lasti)
        if now != place:
            place, since, report_at = now, time.monotonic(), after
            continue
        stalled = time.monotonic() - since
        if stalled >= report_at:
            send(f"at the same line for {stalled:.0f} s: {where(frame)}")
            report_at *= 2
        del frame


def _library(path: str) -> bool:
    return any(part in path for part in ("site-packages", "dist-packages", f"python{sys.version_info[0]}."))


def _short(path: str) -> str:
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return os.path.basename(path)


def where(frame) -> str:
    """``file:line in function`` of the innermost frame of the user's code, and the library call it is
    inside, if any."""
    inner, user = frame, None
    f = frame
    while f is not None:
        if not _library(f.f_code.co_filename) and "sparkml_dist" not in f.f_code.co_filename:
            user = f
            break
        f = f.f_back
    text = ""
    if user is not None:
        text = f"{os.path.basename(user.f_code.co_filename)}:{user.f_lineno} in {user.f_code.co_name}"
    if user is not inner:
        lib = f"{inner.f_code.co_name} ({_short(inner.f_code.co_filename)}:{inner.f_lineno})"
        text = f"{text}, inside {lib}" if text else lib
    return text
