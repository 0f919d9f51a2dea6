"""``sparkml-dist ensemble --function mod:fn``: your own function per group, from a job file.  [driver]

Job file (YAML)::

    input: {path: data.parquet}                     # or a CSV file (header, types inferred)
    params: {group_col: store}                      # train_per_group's keywords: or num_groups: 8,
                                                    # sampling: bootstrap, sample_ratio: 0.5, seed: 7,
                                                    # features_cols: [...], label_col: label, on_error: skip
    output: {members_table: out/members}            # Parquet: group, rows, format, model, metrics, sha256

The function is ``module:function`` (the job file's folder first on ``sys.path``) or
``path/to/file.py:function``, called as ``fn(data, key)`` (see
:func:`sparkml_dist.ensemble.train_per_group`).
"""

from __future__ import annotations

import os

from ..errors import ConfigurationError
from .predict import read_input


def run_per_group_job(spark, job: dict, function: str, base_dir: str) -> dict:
    """Train ``function`` per group as ``job`` says; write the members table; report."""
    from ..ensemble import train_per_group
    from ..tune.job import load_function

    if "input" not in job:
        raise ConfigurationError("the job file needs input: {path: ...}")
    fn = load_function(function, base_dir)
    result = train_per_group(read_input(spark, job["input"]), fn, **dict(job.get("params") or {}))
    report = {
        "function": function,
        "groups": len(result.members),
        "rows": {str(m.group): m.rows for m in result.members},
        "metrics": {str(m.group): m.metrics for m in result.members},
        "skipped": {str(k): v.splitlines()[0] for k, v in result.skipped.items()},
    }
    out = (job.get("output") or {}).get("members_table")
    if out:
        mode = "overwrite" if (job.get("output") or {}).get("overwrite", True) else "errorifexists"
        result.to_table(spark).write.mode(mode).parquet(out)
        report["members_table"] = os.path.abspath(out) if "://" not in out else out
    return report
