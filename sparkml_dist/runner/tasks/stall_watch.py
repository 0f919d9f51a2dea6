"""A rank that stops making progress says where it stands: the heartbeat of a stalled run.  [rank]

While the function runs, a thread samples the main thread's innermost Python frame every few
seconds. When it has not moved for a while — 50 s, or a quarter of ``collective_timeout`` when
that is shorter — the rank sends the driver one line (shown whatever ``log_ranks`` says), then
again at twice, four times ... that long, until it moves::

    [rank 1] at the same line for 50 s: train.py:42 in step, inside load (data.py:7)

**A stuck collective, named.**  Under torch.distributed the same thread also keeps this rank's
status in the run's rendezvous store (a few bytes, at most once per sample: the process group's
collective sequence number, the ``torch.distributed`` call it is in, if any, and its place).  A
rank stalled inside a collective reads every rank's status, and the lowest such rank sends one
line for all of them: the collective's kind and number, how long it has waited, the ranks in it
and each rank that is not, with where that one is::

    [rank 0] stuck collective: all_reduce #17 has waited 50 s: ranks 0, 2-3 in it; not in it: rank 1
    (after collective #16, at train.py:42 in step)

The driver keeps the latest such line and adds it to the run's error when ``collective_timeout``
ends it.  A long call that is working (one large XGBoost round, a slow read) is reported as where
the rank is.  Sampling costs nothing in the training loop: no hook runs in it.
``SPARKML_DIST_STALL_REPORT`` (seconds; 0 turns it off) overrides the delay.

Example::

    watch(threading.get_ident(), send_log)   # before the user's function runs
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional

from .. import protocol

STALL_ENV = "SPARKML_DIST_STALL_REPORT"
DEFAULT_AFTER = 50.0  # + one sample (<= 5 s): a stuck collective is named within a minute
STATUS_KEY = "sparkml_dist/stall/"  # + rank: that rank's status in the rendezvous store
MAX_LISTED = 8  # ranks not in a stuck collective named one by one; the rest counted


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
    place, since, report_at, published = None, time.monotonic(), after, None
    while True:
        time.sleep(poll)
        frame = sys._current_frames().get(thread_id)
        if frame is None:
            return  # the thread ended
        group = _torch_group()
        status = None
        if group is not None:
            status = {"seq": group.seq, "op": collective(frame), "where": where(frame)}
            if status != published and published is not False:  # False: the store went away
                published = status if _publish(group, status) else False
        now = (id(frame), frame.f_lasti)
        if now != place:
            place, since, report_at = now, time.monotonic(), after
            continue
        stalled = time.monotonic() - since
        if stalled >= report_at:
            report_at *= 2
            if status is not None and status["op"]:
                line = stuck_line(group, status, stalled)
                if line is not None:  # None: a lower rank in the same collective says it for all
                    send(protocol.STUCK_MARK + line)
            else:
                send(f"at the same line for {stalled:.0f} s: {status['where'] if status else where(frame)}")
        del frame


class Group(NamedTuple):
    """This rank in the default process group: the rendezvous store, rank, world size, and the
    sequence number of the group's latest collective."""

    store: Any
    rank: int
    world: int
    seq: int


def _torch_group() -> Optional[Group]:
    """This process's default group, or None."""
    dist = sys.modules.get("torch.distributed")  # never imports torch into a rank that has none
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        c10d = dist.distributed_c10d
        seq = c10d._get_default_group()._get_sequence_number_for_group()
        return Group(c10d._get_default_store(), dist.get_rank(), dist.get_world_size(), int(seq))
    except Exception:  # a group being torn down, a backend without a sequence: no status
        return None


def _publish(group: Group, status: dict) -> bool:
    try:
        group.store.set(f"{STATUS_KEY}{group.rank}", json.dumps(status))
        return True
    except Exception:  # the store is gone (rank 0 ended): the line report still works
        return False


def collective(frame) -> str:
    """The ``torch.distributed`` collective the frame is inside (``all_reduce``, ``barrier``), or ''."""
    name, f = "", frame
    while f is not None:
        if f.f_code.co_filename.replace(os.sep, "/").endswith("torch/distributed/distributed_c10d.py"):
            name = f.f_code.co_name  # the outermost one: the call the user's code made
        f = f.f_back
    return name


def _statuses(group: Group, mine: dict) -> Dict[int, dict]:
    store, rank, world = group.store, group.rank, group.world
    out = {rank: mine}
    for r in range(world):
        key = f"{STATUS_KEY}{r}"
        try:
            if r != rank and store.check([key]):
                found = json.loads(store.get(key).decode())
                if isinstance(found, dict) and isinstance(found.get("seq"), int):
                    out[r] = {
                        "seq": found["seq"],
                        "op": str(found.get("op", "")),
                        "where": str(found.get("where", "")),
                    }
        except Exception:  # unreadable or not ours: that rank has no status
            continue
    return out


def stuck_line(group: Group, mine: dict, stalled: float) -> Optional[str]:
    """The line naming who is in the collective this rank is stuck in and who is not; None when a
    lower rank in the same collective will send it."""
    statuses = _statuses(group, mine)
    inside = sorted(r for r, s in statuses.items() if (s["op"], s["seq"]) == (mine["op"], mine["seq"]))
    if inside[0] != group.rank:
        return None
    line = f"{mine['op']} #{mine['seq']} has waited {stalled:.0f} s: {ranks(inside)} in it"
    missing = [r for r in range(group.world) if r not in inside]
    if not missing:
        return (
            line + "; every rank is in it and it does not complete (a link between hosts, or a rank's peer?)"
        )
    named = []
    for r in missing[:MAX_LISTED]:
        s = statuses.get(r)
        if s is None:
            named.append(f"rank {r} (no status yet)")
        elif s["op"]:
            named.append(f"rank {r} (in {s['op']} #{s['seq']}, at {s['where']})")
        else:
            named.append(f"rank {r} (after collective #{s['seq']}, at {s['where']})")
    more = f" and {len(missing) - MAX_LISTED} more" if len(missing) > MAX_LISTED else ""
    return f"{line}; not in it: " + ", ".join(named) + more


def ranks(numbers: List[int]) -> str:
    """``[0, 2, 3, 4]`` -> ``'ranks 0, 2-4'``; one -> ``'rank 0'``."""
    runs: List[List[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    text = ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
    return ("rank " if len(numbers) == 1 else "ranks ") + text


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
