"""Run a task function over the groups of a DataFrame and collect what it returns.  [driver]

``run_on_groups(df, task_fn, spec)`` is ``df.mapInArrow(...)`` plus the collection layer:

* ``task_fn(batches, spec)`` is a *module-level* executor function receiving the task's Arrow
  record batches and a frozen spec of plain values; it yields chunk batches built with
  :mod:`sparkml_dist.collection` (``encode`` / ``encode_error``);
* the job runs under a unique job tag; Ctrl-C (KeyboardInterrupt) on the driver interrupts exactly
  that job, so two runs in one session never cancel each other; a job with a description is a
  phase of the user's call: one progress line when it starts and its time when it ends
  (:func:`sparkml_dist.progress.phase`);
* ``barrier=True`` gang-schedules the tasks (all start together or none);
* ``profile`` attaches a stage-level ResourceProfile (e.g. a GPU per task).

Only the DataFrame API is used, so the same code runs on classic Spark and on Spark Connect.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import threading
import uuid
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Tuple

import pyarrow as pa

from . import collection
from .errors import CollectionError

log = logging.getLogger(__name__)


def session_of(df):
    """The SparkSession of a DataFrame (classic or Connect); on a local master, a warning (once)
    when its executors would start another Python than this driver's."""
    from . import _spark_env, executors

    spark = df.sparkSession
    executors.use_driver_python(spark)  # a local master's executors start this Python
    _spark_env.check_executor_python(spark)
    return spark


@contextlib.contextmanager
def own_interrupts():
    """Ctrl-C raises KeyboardInterrupt here and cancels nothing by itself (main thread only).

    PySpark's SIGINT handler calls ``cancelAllJobs()``: every concurrent run of the SparkContext
    would die with ours.  Inside this scope the interrupt only raises, and the scope that catches it
    cancels its own job tag.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def interrupt(signum, frame):
        raise KeyboardInterrupt()

    try:
        signal.signal(signal.SIGINT, interrupt)
    except (ValueError, OSError):  # not the main interpreter thread after all
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class JobTag:
    """A unique tag for the Spark jobs of one run, and the way to cancel exactly those jobs.

    Jobs started inside :meth:`scope` (in the thread that entered it) carry the tag; :meth:`cancel`
    interrupts them from any thread.  Leaving the scope with an exception (Ctrl-C included)
    cancels them too.  Classic Spark tags the SparkContext's jobs (``addJobTag`` /
    ``cancelJobsWithTag``: a session tag set in one Python thread is not seen by
    ``interruptTag`` from another); Spark Connect tags the session's operations.
    """

    def __init__(self, spark, name: str = "", description: str = "") -> None:
        self.spark = spark
        self.tag = f"sparkml_dist-{name or uuid.uuid4().hex[:12]}"
        self.description = description  # what Spark's UI shows for the jobs (classic Spark)
        self._connect = type(spark).__module__.startswith("pyspark.sql.connect")

    @contextlib.contextmanager
    def scope(self):
        before = None
        if self._connect:
            self.spark.addTag(self.tag)
        else:
            sc = self.spark.sparkContext
            sc.addJobTag(self.tag)
            if self.description:
                before = sc.getLocalProperty("spark.job.description")
                sc.setJobDescription(self.description)
        try:
            with own_interrupts(), self._phase():
                yield self.tag
        except BaseException:
            self.cancel()
            raise
        finally:
            with contextlib.suppress(Exception):
                if self._connect:
                    self.spark.removeTag(self.tag)
                else:
                    self.spark.sparkContext.removeJobTag(self.tag)
                    if self.description:
                        self.spark.sparkContext.setJobDescription(before)

    def _phase(self):
        """A described job is a phase of the user's call: one progress line, and its time."""
        from . import progress

        if not self.description:
            return contextlib.nullcontext()
        return progress.phase(self.description.replace("sparkml_dist: ", "", 1))

    def cancel(self) -> None:
        with contextlib.suppress(Exception):
            if self._connect:
                self.spark.interruptTag(self.tag)
            else:
                self.spark.sparkContext.cancelJobsWithTag(self.tag)


def job_scope(spark, description: str):
    """Tag the Spark jobs started inside; interrupt them on KeyboardInterrupt or error exit."""
    return JobTag(spark, description=description).scope()


def _task_entry(task_fn: Callable, spec: Any, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Executor entry point: run the task, turning an unexpected failure into an error row."""
    try:
        yield from task_fn(batches, spec)
    except Exception as exc:  # reported to the driver as a WorkerError, not retried blindly
        yield collection.encode_error(-1, f"{type(exc).__name__}: {exc}")


def map_groups(
    df, task_fn: Callable, spec: Any, *, barrier: bool = False, catch_errors: bool = True, profile: Any = None
):
    """The lazy DataFrame of chunk rows produced by ``task_fn`` on every partition of ``df``.

    With ``catch_errors`` an exception escaping ``task_fn`` becomes an error row (the task succeeds
    and the driver raises WorkerError); without it the task fails, which a barrier stage needs so
    that Spark stops the other tasks.
    """
    fn = (
        functools.partial(_task_entry, task_fn, spec)
        if catch_errors
        else functools.partial(task_fn, spec=spec)
    )
    if profile is not None:  # stage-level scheduling (e.g. one GPU per task)
        return df.mapInArrow(fn, collection.CHUNK_DDL, barrier=barrier, profile=profile)
    return df.mapInArrow(fn, collection.CHUNK_DDL, barrier=barrier)


def run_on_groups(
    df,
    task_fn: Callable,
    spec: Any,
    *,
    expected_groups: Optional[Iterable[int]] = None,
    barrier: bool = False,
    description: str = "sparkml_dist",
    what: str = "group",
    profile: Any = None,
    tag: Optional[JobTag] = None,
) -> Dict[Tuple[int, int], Any]:
    """Run ``task_fn`` over ``df``'s partitions and return ``{(group, item): object}``.

    ``profile``: a stage-level ResourceProfile for the tasks; ``tag``: the :class:`JobTag` to run
    under, when the caller cancels the job from another thread (default: a fresh one).
    """
    out = map_groups(df, task_fn, spec, barrier=barrier, profile=profile)
    spark = session_of(df)
    try:
        with (tag or JobTag(spark, description=description)).scope():
            table = out.toArrow()
    except Exception as exc:
        if "maxResultSize" not in str(exc):
            raise
        raise CollectionError(
            f"{description}: what the tasks send back is larger than spark.driver.maxResultSize. For a "
            "bagging ensemble set membersDir= (storage the executors and the driver share): each task "
            "then writes its member there and sends back only its metadata. Or raise "
            "spark.driver.maxResultSize."
        ) from exc
    log.debug("%s: collected %d chunk rows (%d bytes)", description, table.num_rows, table.nbytes)
    try:
        return collection.decode(table, expected_groups, what=what)
    finally:
        del table
        give_back_memory()


def give_back_memory() -> None:
    """Return to the system what a collection freed on the driver: Arrow's pool keeps freed
    buffers, and glibc's allocator keeps freed heap pages (measured: a fit of 10^5 keys left
    24 MiB resident that the model did not hold, 11 MiB after this; a fit of 10^6 keys 80 MiB
    after collecting, 19 MiB when this runs again once the fit's own objects are gone, of
    which the model holds 15.5)."""
    import ctypes
    import ctypes.util

    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):  # glibc only
            libc.malloc_trim(0)
    except OSError:
        pass
