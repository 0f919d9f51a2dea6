"""Exceptions raised by sparkml_dist.  [anywhere]

Every error names the parameter, column, group or rank concerned and, where there is one, the fix::

    SparkMLDistError
    ├── ConfigurationError (also ValueError)      bad parameter or bad input, raised on the driver
    ├── InsufficientResourcesError (RuntimeError) the cluster cannot run what was asked
    ├── WorkerError (RuntimeError)                user code failed on an executor (group or rank)
    ├── CollectionError (RuntimeError)            results did not come back complete
    └── RunTimeoutError (TimeoutError)            a run exceeded its wall-clock timeout
"""

from __future__ import annotations

from typing import Optional


class SparkMLDistError(Exception):
    """Base class of every error raised by sparkml_dist."""


class ConfigurationError(SparkMLDistError, ValueError):
    """A parameter, column or input value is invalid; raised before training starts."""


class InsufficientResourcesError(SparkMLDistError, RuntimeError):
    """The cluster has fewer task slots (or GPUs, or memory) than the job needs."""


class CollectionError(SparkMLDistError, RuntimeError):
    """Results from executors are missing or corrupt."""


class WorkerError(SparkMLDistError, RuntimeError):
    """User code failed inside an executor.

    Attributes:
        group: the group (ensemble member) that failed, or None.
        rank: the rank (barrier runner) that failed, or None.
        exit_code: the process exit code when a process died, or None.
        worker_traceback: the traceback or last output lines captured on the executor.
        lost_host: the executor (and its host) Spark lost, when a lost machine caused the failure
            rather than the user's code; None otherwise.
    """

    def __init__(
        self,
        message: str,
        *,
        group: Optional[int] = None,
        rank: Optional[int] = None,
        exit_code: Optional[int] = None,
        worker_traceback: str = "",
        lost_host: Optional[str] = None,
    ) -> None:
        self.lost_host = lost_host
        self.group = group
        self.rank = rank
        self.exit_code = exit_code
        self.worker_traceback = worker_traceback
        full = message
        if worker_traceback:
            full = f"{message}\n--- executor traceback ---\n{worker_traceback.rstrip()}"
        super().__init__(full)

    def __reduce__(self):  # keep the keyword attributes through pickling
        return (
            _rebuild_worker_error,
            (
                self.args[0].split("\n--- executor traceback ---\n")[0],
                self.group,
                self.rank,
                self.exit_code,
                self.worker_traceback,
                self.lost_host,
            ),
        )


def _rebuild_worker_error(message, group, rank, exit_code, worker_traceback, lost_host=None):
    return WorkerError(
        message,
        group=group,
        rank=rank,
        exit_code=exit_code,
        worker_traceback=worker_traceback,
        lost_host=lost_host,
    )


def missing_module_hint(text: str, python: Optional[str]) -> str:
    """What to do when a worker or rank could not import a module: '' unless ``text`` (its
    traceback) says ``ModuleNotFoundError``; names the interpreter the executors ran."""
    import re

    found = re.search(r"ModuleNotFoundError: No module named '([\w.]+)'", text or "")
    if not found:
        return ""
    where = f"the executors ran {python}" if python else "the executors ran another Python"
    return (
        f" ({where}, which cannot import {found.group(1)!r}: install it into that interpreter, or "
        "point spark.pyspark.python / PYSPARK_PYTHON at one that has it, e.g. the driver's own)"
    )


class RunTimeoutError(SparkMLDistError, TimeoutError):
    """A run exceeded its wall-clock ``timeout``; its Spark job was cancelled and ranks killed."""
