"""Spare executors kept warm under ``executor_loss="replace"`` (:mod:`sparkml_dist.runner.tasks.spares`):
while a run trains, the driver starts, on the executor that runs none of its ranks, the very pool a
lost executor's rank would be forked from there. On local-cluster (two executor JVMs, one slot each)."""

import os
import time

from sparkml_dist.runner import BarrierRunner
from tests.conftest import masters
from tests.support import elastic_helpers

pytestmark = masters("cluster")


def test_the_executor_without_a_rank_gets_the_runs_pool_before_its_rank_comes(spark):
    """A run of np=1 holds one executor; the other's slot is free, and gets the pool of the run's
    settings (a key of their own: no earlier run's pool serves them). A run of np=2 of the same
    settings then finds a pool started before it on both executors: the rank on the free one was
    forked from the pool warmed ahead, as a lost executor's replacement there would be.
    Slow (~20 s): the first run waits 8 s for the driver's warm job, and two pools import torch."""
    env = {"POOL_TEST": f"spare-{os.urandom(4).hex()}"}

    def runner(np_):
        return BarrierRunner(
            np_, max_restarts=1, executor_loss="replace", env=env, log_ranks="none", timeout=120
        )

    first = runner(1).run(elastic_helpers.my_pool_started, time.time(), 8.0)
    assert first == {"pool": True, "earlier": False}  # its own pool: started by its own task
    second = runner(2).run(elastic_helpers.my_pool_started, time.time(), return_all=True)
    assert second == [{"pool": True, "earlier": True}] * 2, second
