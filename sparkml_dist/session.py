"""Build a SparkSession for local runs, the CLI and the tests.  [driver]

Library code never builds sessions: it uses the session of the DataFrame it is given.  This helper
is for entry points (``sparkml-dist``, ``make demo``, notebooks, tests), so they all share one
source of settings (``conf/spark-local.yaml``).

Example::

    spark = get_session("local[*]", conf_file="conf/spark-local.yaml")
    spark = get_session("connect:local[2]")          # a local Spark Connect server
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, Optional


def load_conf(path: Optional[str]) -> dict:
    """Spark settings from a YAML mapping file (``{}`` for None)."""
    if not path:
        return {}
    import yaml

    with open(path) as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of Spark settings, got {type(data).__name__}")
    return {str(k): str(v) for k, v in data.items()}


def get_session(
    master: Optional[str] = None,
    *,
    conf: Optional[Mapping[str, str]] = None,
    conf_file: Optional[str] = None,
    app_name: str = "sparkml_dist",
):
    """Get or create a SparkSession.

    ``master``: ``local[N]``, ``local-cluster[N,C,M]``, a cluster URL, ``connect:<master>`` for a
    local Spark Connect server, ``sc://host:port`` for a remote one, or None to use whatever
    ``spark-submit`` configured.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    settings = {**load_conf(conf_file), **(conf or {})}
    builder = SparkSession.builder.appName(app_name)
    if master and master.startswith("connect:"):
        builder = builder.remote(master[len("connect:") :])
    elif master and master.startswith("sc://"):
        builder = builder.remote(master)
    elif master:
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    import warnings

    with warnings.catch_warnings():
        # a local Connect server receives every setting at start-up; pyspark then also tries to
        # set static ones at runtime and warns that it cannot: that second attempt is noise
        warnings.filterwarnings("ignore", message="Failed to set spark", category=UserWarning)
        return builder.getOrCreate()
