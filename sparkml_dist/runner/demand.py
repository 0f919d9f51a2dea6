"""Asking a cluster that can grow for the slots a run is waiting for.  [driver]

A barrier job is submitted only once the cluster holds all its slots, so while the runner waits
nothing is pending and an autoscaler (Databricks' cluster autoscaling, a standalone or
Kubernetes cluster whose executors come back or are added) sees no demand and never grows.
When slots are short and the cluster may grow, :class:`Demand` submits a plain job of ``tasks``
tasks that each hold their slot (sleeping) until the barrier job is about to start: the pending
ones are the demand an autoscaler reacts to.  HorovodRunner on Databricks waits the same way.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Optional

from .. import _spark_env


def may_grow(spark, master: str, world: int) -> bool:
    """Whether more slots may still come: a cluster master (not local, not local-cluster) whose
    configured ceiling, when it has one, holds ``world`` slots."""
    if _spark_env.is_local(master) or master.startswith("local-cluster"):
        return False
    conf = _spark_env.conf_of(spark)
    per_task = _spark_env.task_cpus(conf)
    cores_max = conf("spark.cores.max", None)  # standalone (and Mesos): the application's ceiling
    if master.startswith("spark://") and cores_max:
        return int(cores_max) // per_task >= world
    instances = conf("spark.executor.instances", None)  # YARN / Kubernetes without autoscaling
    dynamic = (conf("spark.dynamicAllocation.enabled", "false") or "").lower() == "true"
    if instances and not dynamic and not conf("spark.databricks.clusterUsageTags.clusterScalingType", None):
        cores = int(conf("spark.executor.cores", "1") or 1)
        return int(instances) * (cores // per_task) >= world
    return True


def _hold(seconds: float):
    def hold(_):
        time.sleep(seconds)  # cancelled (the task killed) as soon as the slots are there
        return iter(())

    return hold


class Demand:
    """``with Demand(spark, tasks, hold_s):`` a job of ``tasks`` slot-holding tasks runs in the
    background until the block ends (then it is cancelled)."""

    def __init__(self, spark, tasks: int, hold_s: float) -> None:
        self.spark, self.tasks, self.hold_s = spark, tasks, hold_s
        self.tag = f"sparkml_dist-demand-{id(self):x}"
        self.thread: Optional[threading.Thread] = None

    def _run(self) -> None:
        sc = self.spark.sparkContext
        sc.addJobTag(self.tag)
        sc.setJobDescription(f"sparkml_dist: asking for {self.tasks} task slots for a barrier run")
        with contextlib.suppress(Exception):  # cancelled: the point of it
            sc.parallelize(range(self.tasks), self.tasks).mapPartitions(_hold(self.hold_s)).count()
        with contextlib.suppress(Exception):
            sc.removeJobTag(self.tag)

    def __enter__(self) -> "Demand":
        self.thread = threading.Thread(target=self._run, name="sparkml_dist-demand", daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(Exception):
            self.spark.sparkContext.cancelJobsWithTag(self.tag)
        if self.thread is not None:
            self.thread.join(10.0)
