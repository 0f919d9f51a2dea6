"""Build a SparkSession for local runs, the CLI and the tests; ship this Python to a cluster.  [driver]

Library code never builds sessions: it uses the session of the DataFrame it is given.  This helper
is for entry points (``sparkml-dist``, ``make demo``, notebooks, tests), so they all share one
source of settings (``conf/spark-local.yaml``).

``ship_environment=True`` packs this Python's environment (:func:`pack_environment`: venv-pack
for a virtual environment, conda-pack for a conda one, whichever applies and is installed: the
``ship`` extra) into an archive that the session hands every executor (``spark.archives``,
unpacked in each executor's working directory), and the executors run its interpreter: a cluster
whose own Python lacks what the driver has (torch, the package itself) runs the driver's. It costs
the archive's size in storage and, on each executor, one copy and unpack of it at its first task
(the environment of this checkout's tests: about 2 GB, packed as a tar.gz at gzip's fastest level
in tens of seconds).

Example::

    spark = get_session("local[*]", conf_file="conf/spark-local.yaml")
    spark = get_session("connect:local[2]")          # a local Spark Connect server
    spark = get_session("spark://master:7077", ship_environment=True)   # executors run this Python
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, Optional, Union


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
    ship_environment: Union[bool, str] = False,
):
    """Get or create a SparkSession.

    ``master``: ``local[N]``, ``local-cluster[N,C,M]``, a cluster URL, ``connect:<master>`` for a
    local Spark Connect server, ``sc://host:port`` for a remote one, or None to use whatever
    ``spark-submit`` configured.  ``ship_environment``: True (or an archive path) to ship this
    Python's environment to the executors and run it there (see the module docstring).
    """
    from pyspark.sql import SparkSession

    settings = {**load_conf(conf_file), **(conf or {})}
    if ship_environment:
        archive = ship_environment if isinstance(ship_environment, str) else pack_environment()
        settings.update(shipped(archive))
        os.environ["PYSPARK_PYTHON"] = EXECUTOR_PYTHON  # what the driver tells the executors to start
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
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


EXECUTOR_PYTHON = "./environment/bin/python"  # the shipped interpreter, in each executor's directory


def shipped(archive: str) -> dict:
    """The settings that hand ``archive`` (:func:`pack_environment`) to every executor and start
    its interpreter there."""
    return {
        "spark.archives": f"{os.path.abspath(archive)}#environment",
        "spark.pyspark.python": EXECUTOR_PYTHON,
    }


def pack_environment(output: Optional[str] = None, prefix: Optional[str] = None) -> str:
    """``prefix`` (default: this Python's environment) packed into a tar.gz that any
    executor can unpack and run: venv-pack for a virtual environment, conda-pack for a conda one
    (the ``ship`` extra brings venv-pack). Returns the archive's path (default: in the temporary
    directory, named after the environment; replaced when it exists)."""
    import tempfile

    from .errors import ConfigurationError

    prefix = os.path.abspath(prefix or sys.prefix)
    name = f"sparkml_dist-env-{os.path.basename(prefix)}.tar.gz"
    output = output or os.path.join(tempfile.gettempdir(), name)
    conda = os.path.isdir(os.path.join(prefix, "conda-meta"))
    venv = os.path.exists(os.path.join(prefix, "pyvenv.cfg"))
    if not (conda or venv):
        raise ConfigurationError(
            f"ship_environment: {prefix} is neither a virtual environment nor a conda one, so there is "
            "nothing self-contained to ship: create one (python -m venv, conda create), install the "
            "package and your frameworks into it, and run the driver from it"
        )
    tool = "conda_pack" if conda else "venv_pack"
    try:
        packer = __import__(tool)
    except ImportError:
        raise ConfigurationError(
            f"ship_environment needs {tool.replace('_', '-')} to pack {prefix}: pip install "
            f"'sparkml_dist[ship]'{' conda-pack' if conda else ''}"
        ) from None
    # tar.gz, not tar: Spark unpacks a plain tar in Java, which drops every file's mode (the shipped
    # python would not be executable) and refuses a link out of the archive (a venv's bin/python3);
    # a gzipped one goes to the system's tar, as YARN's does. Level 1: packing time, not size, counts
    packer.pack(prefix=prefix, output=output, format="tar.gz", compress_level=1, force=True)
    return output
