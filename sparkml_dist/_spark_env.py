"""The one place that knows Spark's environment.  [driver]

Master strings (``local``, ``local[N]``, ``local[*]``, ``local-cluster[N,C,M]``, cluster URLs),
classic vs Spark Connect sessions, task slots, the one memory rule for Python workers, the active
session, and every private JVM call of the package (each guarded: Spark Connect has no JVM on the
client, so each returns None / a fallback there).

Example::

    from sparkml_dist import _spark_env

    spark = _spark_env.active_session("BarrierRunner")
    mem = _spark_env.ClusterMemory.from_spark(spark)
    print(mem.bytes_per_task, _spark_env.registered_slots(spark))
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from typing import Callable, List, Optional

from .errors import ConfigurationError

Conf = Callable[..., Optional[str]]  # conf(key, default=None) -> value


# --------------------------------------------------------------------------- sessions
def conf_of(spark) -> Conf:
    """``conf(key, default=None)`` reading the session's configuration."""
    return lambda key, default=None: spark.conf.get(key, default)


def is_connect(spark) -> bool:
    """True for a Spark Connect session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def active_session(purpose: str, alternative: str = ""):
    """The calling thread's active session, else the default one; a clear error when there is none.

    ``purpose`` names what needs it ("BarrierRunner(np > 0)", ...); ``alternative`` is appended to
    the error as another way out ("use np < 0 to run local processes").
    """
    from pyspark.sql import SparkSession

    try:
        return SparkSession.active()
    except Exception:
        raise ConfigurationError(
            f"{purpose} needs a SparkSession: create one first "
            "(sparkml_dist.session.get_session or SparkSession.builder)"
            f"{', ' + alternative if alternative else ''}."
        ) from None


# --------------------------------------------------------------------------- masters and slots
def master_of(spark) -> str:
    return spark.conf.get("spark.master", "") or ""


def local_master(spark) -> bool:
    """Is ``spark``'s master ``local`` / ``local[N]`` (every task in the driver's own JVM)?"""
    return is_local(master_of(spark))


def is_local(master: str) -> bool:
    """``local`` / ``local[N]`` / ``local[*]``: executors are threads of the driver."""
    return master.startswith("local") and not master.startswith("local-cluster")


def local_cores(master: str) -> int:
    """Cores of a ``local``/``local[N]``/``local[*]`` master (this machine's for ``*``)."""
    inner = master[master.find("[") + 1 : master.find("]")] if "[" in master else "1"
    return (os.cpu_count() or 1) if inner.startswith("*") else max(1, int(inner.split(",")[0]))


def _local_cluster(master: str):
    """(executors, cores per executor, MiB per executor) of a ``local-cluster[N,C,M]`` master."""
    m = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*(\d+)\]", master)
    return tuple(int(x) for x in m.groups()) if m else None


def task_cpus(conf: Conf) -> int:
    return int(conf("spark.task.cpus", "1") or 1)


def master_slots(master: str, conf: Conf) -> Optional[int]:
    """Task slots a local or local-cluster master has by construction (None for other masters)."""
    if re.fullmatch(r"local(\[(\d+|\*)(,\d+)?\])?", master):
        return local_cores(master) // task_cpus(conf) if "[" in master else 1 // task_cpus(conf)
    cluster = _local_cluster(master)
    if cluster:
        return cluster[0] * (cluster[1] // task_cpus(conf))
    return None


def registered_slots(spark) -> Optional[int]:
    """Task slots of the executors registered now (classic Spark; None without JVM access)."""
    try:
        sc = spark.sparkContext._jsc.sc()
        return int(sc.maxNumConcurrentTasks(sc.resourceProfileManager().defaultResourceProfile()))
    except Exception:  # Spark Connect: no JVM to ask
        return None


def live_executors(spark) -> int:
    """Executors registered now (classic Spark; 0 when unknown)."""
    try:
        return max(0, len(spark.sparkContext._jsc.sc().getExecutorMemoryStatus()) - 1)
    except Exception:  # Spark Connect: no JVM access from the client
        return 0


def explain_extended(df) -> str:
    """``df``'s extended EXPLAIN text (classic through the JVM, Connect through the server)."""
    jdf = getattr(df, "_jdf", None)
    if jdf is not None:  # classic
        return str(df.sparkSession._jvm.PythonSQLUtils.explainString(jdf.queryExecution(), "extended"))
    return df._explain_string(mode="extended")


def schedules_gpus(conf: Conf) -> bool:
    """Whether the cluster gives GPUs to executors (or, in local mode, to the driver)."""
    return any(
        conf(k, None) for k in ("spark.executor.resource.gpu.amount", "spark.driver.resource.gpu.amount")
    )


def driver_gpus(spark) -> Optional[List[str]]:
    """The GPU addresses Spark gave the driver (``spark.driver.resource.gpu.*``), or None when it
    gave none or they cannot be read (Spark Connect has no SparkContext)."""
    if spark is None or is_connect(spark):
        return None
    try:
        info = spark.sparkContext.resources.get("gpu")
    except Exception:  # noqa: BLE001 - a context without resource support: nothing assigned
        return None
    addresses = list(getattr(info, "addresses", None) or [])
    return addresses or None


# --------------------------------------------------------------------------- memory
def parse_bytes(text: str) -> int:
    """A Spark memory setting in bytes ("512m", "2g", "1.5t"; a bare number is MiB, as Spark reads it)."""
    t = text.strip().lower().rstrip("b")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if t and t[-1] in mult:
        return int(float(t[:-1]) * mult[t[-1]])
    return int(float(t)) * (1 << 20)


@dataclass(frozen=True)
class ClusterMemory:
    """Executors, slots and the memory their Python workers may use: the one rule of the package.

    Python workers live outside the JVM heap, so their budget is ``spark.executor.pyspark.memory``
    when set, else ``spark.executor.memoryOverhead`` (default max(384 MiB, 10% of the executor's
    memory)); in local mode (executors are threads of the driver) half of this machine's memory.
    """

    executors: int
    cores_per_executor: int
    task_cpus: int
    python_bytes_per_executor: int  # memory the executor's Python workers may use together
    source: str  # the settings it was read from (for error messages)

    @property
    def slots_per_executor(self) -> int:
        return max(1, self.cores_per_executor // max(1, self.task_cpus))

    @property
    def bytes_per_task(self) -> int:
        """What one task's Python worker may use when every slot of an executor is busy."""
        return self.python_bytes_per_executor // self.slots_per_executor

    @classmethod
    def from_spark(cls, spark) -> "ClusterMemory":
        conf = conf_of(spark)
        master = conf("spark.master", "local[*]") or "local[*]"
        cpus = task_cpus(conf)
        py_mem = conf("spark.executor.pyspark.memory", None)
        if is_local(master):
            cores = local_cores(master)
            if py_mem:
                return cls(1, cores, cpus, parse_bytes(py_mem), "spark.executor.pyspark.memory")
            phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            return cls(
                1,
                cores,
                cpus,
                phys // 2,
                "local mode: half of this machine's memory (set spark.executor.pyspark.memory)",
            )
        cluster = _local_cluster(master)
        if cluster:
            executors, cores, executor_mem = cluster[0], cluster[1], cluster[2] << 20
        else:
            executors = live_executors(spark) or int(conf("spark.executor.instances", "1") or 1)
            cores = int(conf("spark.executor.cores", "1") or 1)
            executor_mem = parse_bytes(conf("spark.executor.memory", "1g") or "1g")
        if py_mem:
            return cls(executors, cores, cpus, parse_bytes(py_mem), "spark.executor.pyspark.memory")
        overhead = conf("spark.executor.memoryOverhead", None)
        py_bytes = parse_bytes(overhead) if overhead else max(384 << 20, executor_mem // 10)
        return cls(
            executors,
            cores,
            cpus,
            py_bytes,
            "spark.executor.memoryOverhead (Python workers live outside the JVM heap; set "
            "spark.executor.pyspark.memory to give them their own budget)",
        )


def task_memory_budget(spark) -> int:
    """Bytes a single task's Python worker may use (:attr:`ClusterMemory.bytes_per_task`)."""
    return ClusterMemory.from_spark(spark).bytes_per_task


def max_result_bytes(spark) -> int:
    """What the driver accepts from one job (``spark.driver.maxResultSize``; 0 = unlimited)."""
    text = (spark.conf.get("spark.driver.maxResultSize", "1g") or "1g") if spark is not None else "1g"
    limit = parse_bytes(text)
    return limit - (1 << 20) if limit > 0 else 1 << 62  # room for chunk row overhead


# --------------------------------------------------------------------------- the driver's address
def driver_host(spark) -> str:
    """An address of the driver that executors reach (``spark.driver.host`` on classic Spark)."""
    if spark is not None and not is_connect(spark):
        host = spark.conf.get("spark.driver.host", None)
        if host:
            return host
    from .host.network import host_address

    return host_address()


_PYTHON_CHECKED: set = set()


def executor_python_warning(spark) -> Optional[str]:
    """On a local master, why the executors would start another Python than this driver's (None
    when they start this one, or where it cannot be known: a cluster, Spark Connect).  Said once per
    session by :func:`check_executor_python`."""
    import os
    import shutil
    import sys

    if is_connect(spark) or not (local_master(spark) or master_of(spark).startswith("local-cluster")):
        return None
    conf = conf_of(spark)
    python = conf("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON") or "python3"
    found = shutil.which(python) or python
    if os.path.realpath(found) == os.path.realpath(sys.executable):
        return None
    return (
        f"the executors will start {python} ({os.path.realpath(found)}), not this driver's Python "
        f"({sys.executable}): packages installed here (pyarrow, torch, ...) may be missing there, and "
        f"a fit would fail inside a task with ModuleNotFoundError. Set PYSPARK_PYTHON={sys.executable} "
        "before the session starts, or start it with sparkml_dist.session.get_session()."
    )


def check_executor_python(spark) -> None:
    """Log :func:`executor_python_warning` once per session."""
    key = id(spark)
    if key in _PYTHON_CHECKED:
        return
    _PYTHON_CHECKED.add(key)
    try:
        why = executor_python_warning(spark)
    except Exception:  # noqa: BLE001 - a check that cannot run says nothing
        why = None
    if why:
        import logging

        logging.getLogger("sparkml_dist").warning(why)


# Spark's own loggers that print a barrier task's failure (a JVM stack trace carrying the rank's
# report) on the driver's console: the runner reports that failure itself, once and in words.
_TASK_FAILURE_LOGGERS = (
    "org.apache.spark.executor.Executor",  # local masters: executors run in the driver's JVM
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.scheduler.TaskSchedulerImpl",
)


@contextlib.contextmanager
def quiet_task_failures(spark):
    """Inside: the loggers above print nothing (classic Spark; nothing to do over Connect or
    without a session); their levels are restored on the way out."""
    jvm = (
        getattr(getattr(spark, "sparkContext", None), "_jvm", None)
        if spark is not None and not is_connect(spark)
        else None
    )
    if jvm is None:
        yield
        return
    try:
        log4j = jvm.org.apache.logging.log4j
        context = log4j.LogManager.getContext(False)
        configured = context.getConfiguration().getLoggers()
        # a logger configured by name keeps its level; one that was not goes back to inheriting
        before = {
            name: log4j.LogManager.getLogger(name).getLevel() if configured.containsKey(name) else None
            for name in _TASK_FAILURE_LOGGERS
        }
        for name in _TASK_FAILURE_LOGGERS:
            log4j.core.config.Configurator.setLevel(name, log4j.Level.OFF)
    except Exception:  # noqa: BLE001 - another logging backend: Spark's lines stay
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            config = context.getConfiguration()
            for name, level in before.items():
                if level is None:
                    config.removeLogger(name)
                else:
                    log4j.core.config.Configurator.setLevel(name, level)
            context.updateLoggers()
