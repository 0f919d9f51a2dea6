"""The executors' Python: this driver's own on a local master, and checked before user code runs.  [driver]

1. :func:`use_driver_python`: on a master whose executors all run on this machine (``local[N]``,
   ``local-cluster``) and a session started with no executor Python named (no ``PYSPARK_PYTHON``
   when it started, no ``spark.pyspark.python``), the executors start this driver's interpreter,
   as :func:`sparkml_dist.session.get_session` arranges: a plain ``SparkSession.builder...
   getOrCreate()`` from a virtual environment that was not activated would otherwise start
   ``python3`` from the PATH, which cannot import what this environment holds.
2. :func:`check`: before a run starts any rank, once per session and set of executors (and again
   when a function imports packages not checked yet): one small Spark job, a plain Python UDF
   (it needs nothing but pyspark on the executors) over one task per slot, reports each
   executor's host, interpreter, Python version and the versions of the packages the function
   imports, with numpy, pyarrow and sparkml_dist (found and read from their metadata, never
   imported: milliseconds). A package missing there, another Python minor version, or another
   version of a package is refused before any rank starts, in a few lines: a table (host,
   interpreter, package, the driver's version, the executor's) and what fixes it. The setting
   ``spark.sparkml_dist.versionCheck``: ``refuse`` (default), ``warn`` (differing versions logged,
   missing packages still refused), ``off``.

Example::

    use_driver_python(spark)                      # a no-op unless the executors run here
    check(spark, train, tasks=2)                  # ConfigurationError naming host and package
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import _spark_env
from .errors import ConfigurationError

log = logging.getLogger(__name__)

SETTING = "spark.sparkml_dist.versionCheck"
ALWAYS = ("sparkml_dist", "numpy", "pyarrow")  # what every job of the package needs on executors
_checked: Dict[object, Tuple[frozenset, frozenset]] = {}  # session -> (modules, executors) checked

# the probe runs on executors that may not have this package: it is sent by value (its module
# is none an executor could import), and uses nothing but the standard library
_PROBE = """
def probe(_, wanted):
    import importlib.metadata as md
    import importlib.util
    import json
    import socket
    import sys

    out = {"host": socket.gethostname(), "python": sys.executable, "version": list(sys.version_info[:2])}
    found = {}
    for module, dist in wanted:
        try:
            there = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            there = False
        if not there:
            found[module] = None
            continue
        try:
            found[module] = md.version(dist)
        except Exception:
            found[module] = "?"
    out["modules"] = found
    return json.dumps(out)
"""


def _probe_fn(wanted: Sequence[Tuple[str, str]]) -> Callable:
    namespace: dict = {"__name__": "sparkml_dist_executor_probe"}
    exec(compile(_PROBE, "<sparkml_dist executor probe>", "exec"), namespace)  # noqa: S102 - our own code
    probe = namespace["probe"]
    return lambda value: probe(value, list(wanted))


def use_driver_python(spark) -> None:
    """On a master whose executors run on this machine, with no executor Python named: this
    driver's interpreter (see the module docstring). Classic Spark only (a Connect server starts
    its own executors)."""
    if _spark_env.is_connect(spark) or os.environ.get("PYSPARK_PYTHON"):
        return
    master = _spark_env.master_of(spark)
    if not (_spark_env.local_master(spark) or master.startswith("local-cluster")):
        return
    if _spark_env.conf_of(spark)("spark.pyspark.python"):
        return
    sc = spark.sparkContext
    if sc.pythonExec in ("python3", "python"):  # pyspark's default: whatever is first on the PATH
        sc.pythonExec = sys.executable


def wanted_modules(fn: Optional[Callable]) -> List[str]:
    """:data:`ALWAYS`, and the installed packages (those with a distribution) ``fn`` imports."""
    from . import serialization

    names = set(ALWAYS)
    if fn is not None:
        names |= {m.split(".")[0] for m in serialization.imported_modules(fn)} & set(_distributions())
    return sorted(names)


@functools.lru_cache(maxsize=1)
def _distributions() -> Dict[str, List[str]]:
    """This Python's top-level modules -> their distributions (read once: it lists every package)."""
    import importlib.metadata as md

    return md.packages_distributions()


def _versions(modules: Sequence[str]) -> Dict[str, Tuple[str, Optional[str]]]:
    """module -> (its distribution, the driver's version of it)."""
    import importlib.metadata as md

    dists = _distributions()
    out = {}
    for module in modules:
        dist = (dists.get(module) or [module])[0]
        try:
            out[module] = (dist, md.version(dist))
        except md.PackageNotFoundError:
            out[module] = (dist, None)
    return out


def _executors(spark) -> frozenset:
    """The executors now (classic Spark; empty where they cannot be listed)."""
    try:
        status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
        return frozenset(str(k) for k in status.keySet().toArray())
    except Exception:  # noqa: BLE001 - Connect, or a JVM that will not say: checked once a session
        return frozenset()


def _key(spark):
    if _spark_env.is_connect(spark):
        return ("connect", getattr(spark, "session_id", id(spark)))
    return ("classic", id(spark.sparkContext))


def check(spark, fn: Optional[Callable], tasks: int, what: str = "the function") -> None:
    """Refuse (ConfigurationError) executors whose Python cannot run ``fn`` (see the module)."""
    mode = (_spark_env.conf_of(spark)(SETTING, "refuse") or "refuse").strip().lower()
    if mode == "off":
        return
    if mode not in ("refuse", "warn"):
        raise ConfigurationError(f"{SETTING}={mode!r}: use refuse (the default), warn or off")
    modules = frozenset(wanted_modules(fn))
    key, executors = _key(spark), _executors(spark)
    seen = _checked.get(key)
    if seen is not None and modules <= seen[0] and executors <= seen[1]:
        return  # every package and executor of this run already checked in this session
    drivers = _versions(sorted(modules))
    reports = _probe(spark, [(m, drivers[m][0]) for m in sorted(modules)], tasks)
    problems = _problems(reports, drivers)
    missing = [p for p in problems if p[3] == "(missing)" or p[2] == "python"]
    if missing or (problems and mode == "refuse"):
        raise ConfigurationError(_table(what, problems))
    if problems:
        log.warning("%s", _table(what, problems).replace("cannot run", "differ from the driver's for"))
    _checked[key] = (
        modules | (seen[0] if seen else frozenset()),
        executors | (seen[1] if seen else frozenset()),
    )


def _probe(spark, wanted: List[Tuple[str, str]], tasks: int) -> List[dict]:
    from pyspark.sql import functions as F

    n = max(1, int(tasks))
    if not _spark_env.is_connect(spark):
        n = max(n, spark.sparkContext.defaultParallelism)  # a task per slot: every executor answers
    probe = F.udf(_probe_fn(wanted), "string", useArrow=False)
    try:
        rows = spark.range(0, n, 1, n).select(probe(F.col("id")).alias("r")).distinct().collect()
    except Exception as exc:  # noqa: BLE001 - the interpreter could not even run pyspark's worker
        raise ConfigurationError(_unstartable(spark, exc)) from None
    return [json.loads(r["r"]) for r in rows]


def _problems(reports: List[dict], drivers: Dict[str, Tuple[str, Optional[str]]]) -> List[tuple]:
    """(host, interpreter, package, the driver's version, the executor's) of each difference."""
    mine = "%d.%d" % sys.version_info[:2]
    out = set()
    for r in reports:
        host, python = r.get("host", "?"), r.get("python", "?")
        theirs = ".".join(str(v) for v in r.get("version") or [])
        if theirs != mine:
            out.add((host, python, "python", mine, theirs))
            continue
        for module, version in (r.get("modules") or {}).items():
            _, driver = drivers.get(module, (module, None))
            if version is None:
                out.add((host, python, module, driver or "?", "(missing)"))
            elif driver is not None and version != "?" and version != driver:
                out.add((host, python, module, driver, version))
    return sorted(out)


def _table(what: str, problems: List[tuple]) -> str:
    shown = problems[:6]
    width = max(len(p[1]) for p in shown)
    lines = [
        f"the executors' Python cannot run {what} (checked before any rank started):",
        f"  {'host':16} {'interpreter':{width}}  {'package':14} {'driver':12} executor",
    ]
    lines += [f"  {h[:16]:16} {py:{width}}  {pkg:14} {d:12} {e}" for h, py, pkg, d, e in shown]
    if len(problems) > len(shown):
        lines.append(f"  ... and {len(problems) - len(shown)} more")
    lines.append(
        "Fix: point the executors at a Python with the driver's packages (spark.pyspark.python, or "
        "PYSPARK_PYTHON before the session starts), install them there, or ship the driver's "
        "environment (get_session(ship_environment=True): docs/install.md); "
        "spark.sparkml_dist.versionCheck=warn accepts differing versions."
    )
    return "\n".join(lines)


def _unstartable(spark, exc: BaseException) -> str:
    import re

    text = str(exc)
    module = re.search(r"No module named '([\w.]+)'", text)
    python = (
        getattr(getattr(spark, "sparkContext", None), "pythonExec", None)
        if not _spark_env.is_connect(spark)
        else None
    )
    where = re.search(r"\(([\w.\-]+) executor [\w.]+\)", text)
    lines = [ln.strip() for ln in text.splitlines() if "py4j" not in ln]
    first = next(
        (ln for ln in lines if "Cannot run program" in ln),  # the interpreter itself would not start
        next((ln for ln in lines if "Error" in ln), text[:200]),
    )
    return (
        f"the executors' Python{f' ({python})' if python else ''} could not run a Python task"
        f"{f' on {where.group(1)}' if where else ''}"
        f"{f': it cannot import {module.group(1)!r}' if module else f': {first[:300]}'}.\n"
        "Fix: point the executors at a Python with the driver's packages (spark.pyspark.python, or "
        "PYSPARK_PYTHON before the session starts), or ship the driver's environment "
        "(get_session(ship_environment=True): docs/install.md)."
    )
