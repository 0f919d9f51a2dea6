"""How many ranks a run starts with: ``np="auto"``, and a restart's world with ``min_np``.  [driver]

``BarrierRunner(np=4, min_np=2, max_restarts=k)``: the first attempt needs ``np`` ranks, as
always.  After a failure, the next attempt takes as many ranks as the cluster holds task slots
for *now*, between ``min_np`` and ``np`` (waiting up to ``start_timeout`` for ``min_np``), instead
of waiting for the old count: a lost host no longer blocks the run.  When slots come back, a later
restart grows back towards ``np``.  The function sees the new ``WORLD_SIZE``; ``run_with_data``
deals the rows again for it; the checkpoint resumes the state.  The global batch size and the
learning rate's scaling with the world size are the function's to choose (torchrun's
``--nnodes=min:max`` leaves them to the script too).
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from .. import _spark_env
from ..errors import ConfigurationError, InsufficientResourcesError

SETTLE_S = 3.0  # the driver hears of a lost executor a moment after its ranks fail: look this long


def restart_world(
    spark,
    np_: int,
    min_np: int,
    per_task: int,
    wait_s: float,
    say: Callable[[str], None],
    slots: Callable[[object], Optional[int]] = _spark_env.registered_slots,
) -> int:
    """The world size of the next attempt: the fewest slots seen over SETTLE_S (a lost executor
    is counted out), at least ``min_np`` (waited for up to ``wait_s``), at most ``np``, a
    multiple of ``per_task`` (ranks per barrier task)."""
    seen = []
    end = time.monotonic() + SETTLE_S
    while True:
        now = slots(spark)
        if now is None:  # no JVM to ask (Spark Connect): Spark's barrier check decides
            return np_
        seen.append(now)
        if time.monotonic() >= end:
            break
        time.sleep(0.5)
    have = min(seen)
    deadline = time.monotonic() + wait_s
    while have * per_task < min_np and time.monotonic() < deadline:
        time.sleep(0.5)
        have = slots(spark) or 0
    world = min(np_, have * per_task) // per_task * per_task
    if world < min_np:
        raise InsufficientResourcesError(
            f"min_np={min_np}: the cluster holds {have * per_task} rank(s) now, fewer than min_np, "
            f"and no more came within start_timeout={wait_s:.0f}s; add executors or lower min_np."
        )
    if world != np_:
        say(f"[sparkml_dist] the cluster holds {world} of np={np_} ranks now: restarting with {world}\n")
    return world


def all_slots(spark, param: str = "np=0") -> int:
    """Every task slot: a local master's, else those of the executors registered now."""
    slots = _spark_env.master_slots(_spark_env.master_of(spark), _spark_env.conf_of(spark))
    if slots is None:
        slots = _spark_env.registered_slots(spark)
    if slots is None:  # Spark Connect to a cluster
        raise ConfigurationError(
            f"{param} (every task slot) cannot count this cluster's task slots from here; pass a number"
        )
    return slots


def auto_np(spark, use_gpu: bool, gpus_per_rank: int = 1) -> int:
    """``np="auto"``: one rank per GPU with ``use_gpu`` (the driver's on a local master, the tasks'
    on a cluster), else one per task slot."""
    from .. import gpus as gpus_mod

    master = _spark_env.master_of(spark)
    if not use_gpu:
        return all_slots(spark, 'np="auto"')
    if _spark_env.is_local(master):
        found, source = gpus_mod.local(spark)
        n = len(found) // max(1, gpus_per_rank)
        if n < 1:
            raise InsufficientResourcesError(
                f'np="auto" with use_gpu=True: this machine shows {len(found)} GPU(s) ({source}); '
                "set use_gpu=False, or a number of ranks"
            )
        return n
    per_task = float(_spark_env.conf_of(spark)("spark.task.resource.gpu.amount", "1") or 1)
    return max(1, int(all_slots(spark, 'np="auto"') * max(per_task, 1.0)) // max(1, gpus_per_rank))
