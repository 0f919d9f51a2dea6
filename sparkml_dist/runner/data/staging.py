"""Any DataFrame to the ranks at the speed of a Parquet scan: written once, read in place.  [driver]

A DataFrame that is not a plain Parquet scan (a join, a feature pipeline's output, a filter) is
written once by the executors as Parquet files under a *staging directory*, one Spark job with no
shuffle, and the ranks then read those files exactly as they read a Parquet scan
(:mod:`sparkml_dist.runner.data.parquet_split`: contiguous row ranges whose sizes differ by at most one row).
The exact deal through Spark (``read_files=False``: rows dealt by a hash of their content, the same
shards however the input is partitioned) costs a counting job, a shuffle and a sort; this costs
the write.  The files serve every attempt of the run (a restart, an elastic resize re-cuts them)
and are removed when the run ends.

Where the files go: ``BarrierRunner(staging_dir=...)``, else the Spark setting
``spark.sparkml_dist.stagingDir``, else, when every rank runs on this machine (``local[N]``,
``local-cluster[...]``, ``np < 0``), a directory under this machine's temporary directory.  On any
other cluster, with neither set, the rows take the exact deal (the driver's temporary directory
is not the executors'); set one to a path every executor writes and the driver reads (``s3://``,
``gs://``, ``hdfs://``, a shared mount such as ``/dbfs/tmp``).

Example::

    staged = stage(df, root)          # df.write.parquet(root/run-<id>): one job
    split, _ = parquet_split.split_files(staged.df, 4)
    ...
    staged.remove()
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import uuid
from typing import Optional, Tuple

from ... import _spark_env
from ...errors import ConfigurationError
from . import parquet_split

log = logging.getLogger(__name__)

STAGING_CONF = "spark.sparkml_dist.stagingDir"


def root(spark, staging_dir, local_ranks: bool) -> Tuple[Optional[str], str]:
    """``(the staging root, "")``, or ``(None, why the rows take the exact deal instead)``."""
    if staging_dir is False:
        return None, "staging_dir=False"
    if staging_dir:
        return staging_dir, ""
    conf = spark.conf.get(STAGING_CONF, None) if spark is not None else None
    if conf:
        return conf, ""
    master = _spark_env.master_of(spark) if spark is not None else ""
    if local_ranks or _spark_env.is_local(master) or master.startswith("local-cluster"):
        return os.path.join(tempfile.gettempdir(), f"sparkml_dist-staging-{os.getuid()}"), ""
    return None, (
        f"no staging directory: set {STAGING_CONF} (or BarrierRunner(staging_dir=...)) to a path "
        "every executor writes and the driver reads (s3://, hdfs://, a shared mount such as /dbfs/tmp) to "
        "feed any DataFrame from Parquet files"
    )


class Staged:
    """A DataFrame written as Parquet at ``path``; ``df`` reads it back (a plain Parquet scan)."""

    def __init__(self, path: str, df) -> None:
        self.path, self.df = path, df

    def remove(self) -> None:
        """Delete the files (a failure to is logged: the directory is the run's own)."""
        try:
            if "://" in self.path:
                from pyarrow import fs as pafs

                filesystem, where = pafs.FileSystem.from_uri(self.path)
                filesystem.delete_dir(where)
            else:
                shutil.rmtree(self.path, ignore_errors=False)
        except FileNotFoundError:
            pass
        except Exception as exc:  # never hide the run's own result or error behind a cleanup
            log.warning("could not remove the staged rows at %s: %s", self.path, exc)


def stage(df, root_dir: str) -> Staged:
    """Write ``df`` once as Parquet under ``root_dir`` (a new directory of its own)."""
    path = root_dir.rstrip("/") + f"/run-{uuid.uuid4().hex[:12]}"
    if "://" not in path:
        try:
            os.makedirs(root_dir, exist_ok=True)
            if not os.access(root_dir, os.W_OK | os.X_OK):
                raise PermissionError(f"{root_dir} is not writable")
        except OSError as exc:
            raise ConfigurationError(
                f"staging_dir={root_dir!r}: cannot write there ({exc}). Give BarrierRunner(staging_dir=...) "
                f"(or {STAGING_CONF}) a directory every executor writes, or read_files=False to deal "
                "the rows through Spark"
            ) from None
    log.info("run_with_data: writing the rows once as Parquet to %s", path)
    df.write.mode("error").parquet(path)  # a fresh directory: never over anything (Connect spells it so)
    return Staged(path, df.sparkSession.read.schema(df.schema).parquet(path))  # no inference job


def why_not(df, order_must_repeat: bool) -> Optional[str]:
    """Why ``df`` takes the exact deal instead of being staged, or None.

    ``order_must_repeat``: this run may resume a position another run saved (``checkpoint_dir``),
    or fixes ``streams=`` to repeat the sample order on any world size.  Staged rows keep the
    order in which Spark computes them, and rows out of a shuffle (a repartition, a join that is
    not broadcast, an aggregation) come in the order their blocks arrive, which may differ
    between runs: those rows are dealt by content instead, so a resumed run skips exactly the
    rows the saved position had already trained on.
    """
    why = parquet_split.unreadable_column(df)
    if why or not order_must_repeat:
        return why
    try:
        plan = _spark_env.explain_extended(df).split("== Physical Plan ==", 1)[-1]
    except Exception as exc:  # a plan we cannot read: the order is not known to repeat
        return f"its plan could not be inspected ({type(exc).__name__})"
    if re.search(r"(?<!Broadcast)Exchange ", plan):
        return (
            "its rows come out of a shuffle, in an order that may differ between runs, and this run "
            "may resume another run's position (checkpoint_dir) or repeat its order (streams=)"
        )
    return None
