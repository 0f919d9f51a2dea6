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


SECRET_FILES = ("pip.conf", "pip.ini", ".env", ".netrc")  # left out of a shipped environment
# pyspark's JVM side, left out too: the executors' JVMs are the cluster's own Spark, and their Python
# workers import only pyspark's Python part (the jars are ~460 MB of a ~2 GB archive); ``work/`` is
# a local-cluster's scratch (each executor's copy of an earlier archive, unpacked: GBs)
JVM_SIDE = ("lib/python*/site-packages/pyspark/jars/*", "lib/python*/site-packages/pyspark/work/*")
LARGE_BYTES = 2 << 30  # an archive past this is said to be large (every executor copies it)


def pack_environment(output: Optional[str] = None, prefix: Optional[str] = None) -> str:
    """``prefix`` (default: this Python's environment) packed into a tar.gz that any executor can
    unpack and run: venv-pack for a virtual environment, conda-pack for a conda one (the ``ship``
    extra brings venv-pack).  Returns the archive's path.

    By default the archive lies in a directory of this user's own (``<tmp>/sparkml_dist-env-<uid>``,
    mode 0700, refused when it is a link, another user's or open to others) and is named after the
    environment's full path (two projects' ``.venv`` folders never share an archive); it is written
    under a temporary name and moved into place.  A given ``output`` must be a new path or this
    user's regular file.  Files that may hold credentials (``pip.conf``, ``pip.ini``, ``.env``,
    ``.netrc``: a private index's token, say) are left out, and a warning names them; an
    environment with editable installs is refused, naming them; an archive over 2 GiB is said to
    be large.  pyspark's jars are left out (:data:`JVM_SIDE`): an executor runs the cluster's own
    Spark and needs only the Python part."""
    import logging

    log = logging.getLogger(__name__)
    prefix = os.path.realpath(prefix or sys.prefix)
    packer = _packer(prefix)
    secrets = secret_files(prefix)
    if secrets:
        log.warning(
            "ship_environment: left out of the archive of %s, as they may hold credentials (a private "
            "index's token, passwords): %s",
            prefix,
            ", ".join(secrets),
        )
    directory, name = _archive_place(output, prefix)
    size = _pack(packer, prefix, directory, name, secrets)
    if size > LARGE_BYTES:
        log.warning(
            "ship_environment: the archive of %s is %.1f GiB; every executor copies and unpacks it "
            "at its first task. Ship a smaller environment (only what the job imports)",
            prefix,
            size / (1 << 30),
        )
    return os.path.join(directory, name)


def _packer(prefix: str):
    """venv-pack or conda-pack, whichever packs ``prefix``; an environment neither can ship (none
    at all, or one with editable installs) refused by name."""
    from .errors import ConfigurationError

    conda = os.path.isdir(os.path.join(prefix, "conda-meta"))
    venv = os.path.exists(os.path.join(prefix, "pyvenv.cfg"))
    if not (conda or venv):
        raise ConfigurationError(
            f"ship_environment: {prefix} is neither a virtual environment nor a conda one, so there is "
            "nothing self-contained to ship: create one (python -m venv, conda create), install the "
            "package and your frameworks into it, and run the driver from it"
        )
    editable = editable_installs(prefix)
    if editable:
        raise ConfigurationError(
            f"ship_environment: {prefix} has packages installed in editable mode ({', '.join(editable)}): "
            "the archive would hold only links to their source folders, which the executors do not "
            "have. Install them without -e (pip install ./path, or a wheel) in the environment you "
            "ship, or ship another environment"
        )
    tool = "conda_pack" if conda else "venv_pack"
    try:
        return __import__(tool)
    except ImportError:
        raise ConfigurationError(
            f"ship_environment needs {tool.replace('_', '-')} to pack {prefix}: pip install "
            f"'sparkml_dist[ship]'{' conda-pack' if conda else ''}"
        ) from None


def _pack(packer, prefix: str, directory: str, name: str, secrets: list) -> int:
    """``prefix`` packed as ``directory/name`` (reached through the directory's descriptor, written
    under a temporary name, then moved), without ``secrets``; its size."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _check_target(fd, name, os.path.join(directory, name))
        tmp = f".{name}.{os.getpid()}.tmp"
        # tar.gz, not tar: Spark unpacks a plain tar in Java, which drops every file's mode (the
        # shipped python would not be executable) and refuses a link out of the archive (a venv's
        # bin/python3); a gzipped one goes to the system's tar, as YARN's does. Level 1: packing
        # time, not size, counts
        packer.pack(
            prefix=prefix,
            output=f"/proc/self/fd/{fd}/{tmp}",  # inside the directory checked, whatever its path
            format="tar.gz",
            compress_level=1,
            force=True,
            filters=[("exclude", pattern) for pattern in (*JVM_SIDE, *secrets)],
        )
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        return os.stat(name, dir_fd=fd).st_size
    finally:
        os.close(fd)


def _archive_place(output: Optional[str], prefix: str):
    """(directory, file name) of the archive: ``output``'s, or the private default."""
    import hashlib
    import tempfile

    from .errors import ConfigurationError
    from .formats.files import private_dir_fault

    if output is not None:
        output = os.path.abspath(output)
        return os.path.dirname(output), os.path.basename(output)
    directory = os.path.join(tempfile.gettempdir(), f"sparkml_dist-env-{os.getuid()}")
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    why = private_dir_fault(os.lstat(directory))
    if why or os.lstat(directory).st_mode & 0o077:
        raise ConfigurationError(
            f"ship_environment: {directory} {why or 'is open to other users'}: the archive would be "
            "written where another user can read or replace it. Remove it, or set TMPDIR to a "
            "directory of your own"
        )
    digest = hashlib.sha256(prefix.encode()).hexdigest()[:16]
    return directory, f"{os.path.basename(prefix).lstrip('.') or 'env'}-{digest}.tar.gz"


def _check_target(dir_fd: int, name: str, shown: str) -> None:
    """Refuse an archive path that exists and is not this user's regular file."""
    import stat

    from .errors import ConfigurationError

    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        kind = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"another user's (uid {st.st_uid})"
        raise ConfigurationError(
            f"ship_environment: {shown} exists and is {kind}; refusing to write the archive there. "
            "Remove it, or pack to another path"
        )


def secret_files(prefix: str) -> list:
    """The files of ``prefix`` (relative paths) that may hold credentials: :data:`SECRET_FILES`."""
    found = []
    for root, _, files in os.walk(prefix):
        for name in files:
            if name in SECRET_FILES:
                found.append(os.path.relpath(os.path.join(root, name), prefix))
    return sorted(found)


def editable_installs(prefix: str) -> list:
    """What is installed in ``prefix`` in editable mode (``pip install -e``): ``.pth`` lines that
    point outside it (the setuptools way, as venv-pack finds them) and distributions whose
    ``direct_url.json`` says editable (PEP 660)."""
    import glob
    import json

    found = set()
    for pth in glob.glob(os.path.join(prefix, "lib", "python*", "site-packages", "*.pth")):
        with open(pth, errors="replace") as fh:
            for line in fh:
                line = line.strip()
                if not line or line.startswith(("#", "import ")):
                    continue
                location = os.path.normpath(os.path.join(os.path.dirname(pth), line))
                if not location.startswith(prefix):
                    found.add(os.path.basename(pth)[: -len(".pth")])
    for url in glob.glob(
        os.path.join(prefix, "lib", "python*", "site-packages", "*.dist-info", "direct_url.json")
    ):
        try:
            with open(url) as fh:
                editable = (json.load(fh).get("dir_info") or {}).get("editable")
        except (OSError, ValueError, AttributeError):
            continue
        if editable:
            found.add(os.path.basename(os.path.dirname(url)).split("-")[0])
    return sorted(found)
