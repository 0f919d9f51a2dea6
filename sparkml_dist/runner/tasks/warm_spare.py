"""A warm job's task: start this executor's pool for a run's ranks ahead of them.  [executor]

The task side of :mod:`.spares`: run on a free slot, it starts the pool that a
rank of the run would be forked from here (:mod:`.warm_pool`: the key of the run's rank
environment, anchored to Spark's Python daemon as a rank task's is), and returns once the pool's
socket accepts; the pool imports the framework in its own process, then forks a standby that
makes the imports of a rank's first steps too (:mod:`.standby`), which the next rank asked of this
pool becomes.

Example::

    spark.range(0, 2, 1, 2).mapInArrow(functools.partial(warm_pool_here, spec=spec), "started int")
"""

from __future__ import annotations

import os

from .. import backends
from . import warm_pool


def warm_pool_here(batches, spec):
    """[executor] The pool that a rank of ``spec`` would be forked from on this executor, started
    (returns once its socket accepts; it imports the framework in its own process).  One row: 1,
    or 0 where no pool can be (warm ranks off, no trusted pool directory) or its start failed."""
    import pyarrow as pa

    for _ in batches:
        pass
    try:
        started = _start(spec)
    except Exception:  # noqa: BLE001 - never a failed task: Spark would run it again (maxFailures)
        started = 0
    yield pa.RecordBatch.from_arrays([pa.array([started], pa.int32())], ["started"])  # "started int"


def _start(spec) -> int:
    backend = backends.get(spec.backend)
    if not (spec.warm_ranks and backend.warm_ranks and warm_pool.enabled()):
        return 0
    env = spec.rank_env(0, None)
    pool = warm_pool.Pool.of(env, backend.name, os.getppid())  # the anchor of a rank task here
    if pool is None:
        return 0
    pool.start(env)
    pool.keep_standby()  # the lost executor's rank then starts with a first step's imports made
    return 1
