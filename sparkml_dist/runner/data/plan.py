"""A run's DataFrame, planned once on the driver and dealt to the ranks at each attempt.  [driver]

:func:`plan` is step 1 of :mod:`sparkml_dist.runner.data` (the vector columns' widths, the
columns as the ranks get them); :meth:`Data.deal` is step 2, once per attempt (the world may
change after an elastic restart): the files of a plain Parquet scan, or of the rows staged once
(kept for the run's restarts, removed by :meth:`Data.remove`), or the exact deal through Spark.

Example::

    data = plan(df, runner, replicas=None, streams=None)
    spec_data, rows = data.deal(world=2, per_task=1, deadline=deadline)   # rows: None when read from files
    data.remove()                                                          # at the end of the run
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, Optional

from . import sharding, staging

log = logging.getLogger(__name__)


@dataclass
class Data:
    """What ``run_with_data`` got, and what the run made of it."""

    scan: object  # the DataFrame as given: a plain Parquet scan's files are read as they are
    df: object  # as the ranks get it: vector columns as arrays (Spark's path, staging)
    widths: Dict[str, int]  # each vector column's width, which every row read must have
    runner: object
    replicas: Optional[int] = None
    streams: Optional[int] = None
    local: bool = False  # every rank runs on this machine (local processes)
    staged: Optional[staging.Staged] = field(default=None, repr=False)  # written once per run

    def deal(self, world: int, per_task: int, deadline, readers: Optional[int] = None):
        """(the TaskSpec's ``data``, the DataFrame whose partition t is task t's rows, or None);
        ``readers``: the first ranks, which read the rows (the others, reduction servers, none)."""
        from ..deadlines import within

        r, cut = self.runner, (readers or world, self.replicas, self.streams)
        with within(self.df.sparkSession, deadline, "dealing the DataFrame's rows to ranks"):
            if r.read_files:
                scan = self.staged.df if self.staged else self.scan
                files, why = sharding.file_split(scan, *cut, widths=self.widths)
                if files is None and self.staged is None:
                    files = self._stage(why, cut)
                if files is not None:
                    return files, None
            return sharding.spark_shards(
                self.df, world, r.seed, per_task, self.replicas, self.streams, readers=readers
            )

    def _stage(self, not_files: str, cut):
        """Not a plain Parquet scan: the rows written once as Parquet and read from there (once
        per run: restarts and resizes re-cut the same files), or None for the exact deal."""
        r = self.runner
        where, why = staging.root(self.df.sparkSession, r.staging_dir, self.local)
        why = why or staging.why_not(self.df, bool(r.checkpoint_dir or self.streams))
        if why:
            log.info("run_with_data: the rows are dealt through Spark (%s; %s)", not_files, why)
            return None
        self.staged = staging.stage(self.df, where)
        files, why = sharding.file_split(self.staged.df, *cut)
        if files is None:  # the staged files cannot be read from here (a remote Connect server's)
            log.info("run_with_data: the staged rows are dealt through Spark: %s", why)
            self.remove()
        return files

    def remove(self) -> None:
        """The staged copy, if one was written: removed (the end of the run)."""
        if self.staged is not None:
            self.staged.remove()
            self.staged = None


def plan(
    df, runner, replicas: Optional[int] = None, streams: Optional[int] = None, local: bool = False
) -> Optional[Data]:
    """Step 1 for ``df`` (None for ``run()``, which has no data): its vector columns checked and
    measured (refused by name before any job), the columns the ranks will get; ``local``: the
    ranks run on this machine (a staging directory may be this machine's)."""
    if df is None:
        return None
    widths = sharding.vector_widths(df)
    return Data(df, sharding.rank_columns(df, widths), widths, runner, replicas, streams, local)


def stage_once(df, staging_dir=None):
    """``(a DataFrame for run_with_data of many runs, remove)``: ``df`` as it is when its files can
    be read in place (a plain Parquet scan) or no staging directory can serve the ranks; else ``df``
    written once as Parquet (as one ``run_with_data`` would for itself) and read back from there,
    so every run reads the same files and none writes them again; ``remove()`` deletes them."""
    files, _ = sharding.file_split(df, 1, widths=sharding.vector_widths(df))
    if files is not None:
        return df, lambda: None
    where, why = staging.root(df.sparkSession, staging_dir, False)
    if why or staging.why_not(df, False):
        return df, lambda: None  # each run deals the rows itself, as run_with_data does
    staged = staging.stage(df, where)
    return staged.df, staged.remove
