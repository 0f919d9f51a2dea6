"""Shared fixtures.  One SparkSession per pytest run; its master comes from SPARKML_DIST_TEST_MASTER:

* ``local[2]`` (default), ``local-cluster[2,1,1024]`` (separate executor JVMs),
* ``connect:local[2]`` (a local Spark Connect server),
* ``standalone`` (a Spark standalone master and two 1-core workers on loopback, started here),
* ``hosts`` (three network namespaces: the driver in one, a standalone master + worker in the
  second, a worker in the third: tests/support/hosts.py; the tests/hosts pass).

``.ci/run`` runs tests/spark once per mode; tests/unit need no Spark at all.
"""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MASTER = os.environ.get("SPARKML_DIST_TEST_MASTER", "local[2]")
IS_CONNECT = MASTER.startswith("connect:")
IS_CLUSTER = MASTER.startswith("local-cluster")
IS_STANDALONE = MASTER == "standalone"
IS_HOSTS = MASTER == "hosts"

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# Every JVM the suite starts (drivers, Connect servers, executors, standalone masters and workers)
# compiles with C1 only and collects with the serial GC: they live seconds to minutes on small data,
# where C2's compiler threads take CPU the tests need on a 2-core machine (a session start, a fit
# and a run: 15.3 s -> 12.4 s).  Only the suite's JVMs: a user's session keeps Java's defaults.
TEST_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault(
    "PYSPARK_SUBMIT_ARGS",
    f"--driver-java-options '{TEST_JAVA_OPTIONS}' "
    f"--conf 'spark.executor.extraJavaOptions={TEST_JAVA_OPTIONS}' pyspark-shell",
)
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", TEST_JAVA_OPTIONS)
# this run's id, inherited by every process it starts: the leak checks count only this run's ranks
os.environ["SPARKML_DIST_TEST_SUITE"] = __import__("uuid").uuid4().hex
# executors of local-cluster import tests' helper modules (estimators defined in tests)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)


@pytest.fixture(scope="session")
def hosts():
    """The several-hosts cluster (``hosts`` pass only), this process in its driver namespace."""
    from tests.support import hosts as cluster

    if not IS_HOSTS:
        pytest.skip("runs in the several-hosts pass (make test-hosts)")
    why = cluster.unavailable()
    if why:
        pytest.skip(f"cannot build test hosts here: {why}")
    with cluster.Hosts(cores=3, memory="2g") as built:
        yield built


@pytest.fixture(scope="session")
def spark(request):
    import contextlib

    from sparkml_dist.session import get_session

    conf = {}
    if IS_CLUSTER or IS_STANDALONE or IS_HOSTS:
        conf["spark.executorEnv.PYTHONPATH"] = os.environ["PYTHONPATH"]
    with contextlib.ExitStack() as stack:
        master = MASTER
        if IS_HOSTS:
            from tests.support.hosts import SPARK_CONF

            cluster = request.getfixturevalue("hosts")
            master = cluster.master_url
            # two executors of 2 cores, one per worker host; each worker keeps a core for the
            # CLI's own application (tests/hosts/test_across_hosts.py)
            conf.update(SPARK_CONF)
            conf.update(
                {
                    "spark.driver.host": cluster.driver.address,
                    "spark.driver.bindAddress": cluster.driver.address,
                    "spark.executor.cores": "2",
                    "spark.cores.max": "4",
                    "spark.executor.memory": "1g",
                }
            )
        if IS_STANDALONE:
            from tests.support.standalone import StandaloneCluster

            master = stack.enter_context(StandaloneCluster(workers=2, cores=1, memory="1g"))
            conf.update(
                {
                    "spark.executor.cores": "1",
                    "spark.cores.max": "2",
                    "spark.executor.memory": "768m",
                    "spark.decommission.enabled": "true",  # test_restarts: an executor handed over
                }
            )
        if IS_CONNECT and os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
            # pyspark's in-process server always binds 15002 (the first worker's): the others
            # start one of their own on a free port and reach it over sc://
            from sparkml_dist.session import load_conf
            from tests.support.connect_server import ConnectServer

            settings = load_conf(os.path.join(ROOT, "conf", "spark-local.yaml"))
            server = ConnectServer(MASTER[len("connect:") :], settings, TEST_JAVA_OPTIONS)
            master = stack.enter_context(server)
        session = get_session(
            master,
            conf=conf,
            conf_file=os.path.join(ROOT, "conf", "spark-local.yaml"),
            app_name="sparkml_dist-tests",
        )
        yield session
        session.stop()


@pytest.fixture(scope="session")
def master():
    return MASTER


# ------------------------------------------------------------------ which masters a test runs on
# Each test lists the masters (passes) it runs on, positively: ``@masters("local", "connect")``, or
# its folder's default below; a pass deselects (not skips) the tests that are not its own, and
# ``pytest --co -q --matrix`` prints the whole matrix.  Cluster (separate executor JVMs) only for
# what they can change: executor-side state, what travels to another process, several executors.
PASSES = {
    "local[2]": "local",
    "connect:local[2]": "connect",
    "local-cluster[2,1,1024]": "cluster",
    "standalone": "standalone",
    "hosts": "hosts",
}
# the oldest supported pyspark's pass runs on local[2] too, with its own name (make test-oldest)
THIS_PASS = os.environ.get("SPARKML_DIST_TEST_PASS") or PASSES.get(MASTER, MASTER)
DEFAULT_MASTERS = {
    "unit": ("local",),  # no Spark at all: the local pass (and make test-fast)
    "spark": ("local", "connect"),
    "e2e": ("local",),
    "gpu": ("local",),
    "hosts": ("hosts",),
    "notebooks": ("notebooks",),
}


def masters(*names):
    """The passes a test (or, as ``pytestmark``, a module) runs on."""
    unknown = set(names) - set(PASSES.values()) - {"notebooks", "oldest"}
    if unknown:
        raise ValueError(f"unknown masters {sorted(unknown)}; known: {sorted(PASSES.values())}")
    return pytest.mark.masters(*names)


def _masters_of(item) -> tuple:
    marker = item.get_closest_marker("masters")
    if marker is not None:
        return marker.args
    folder = os.path.relpath(str(item.fspath), os.path.join(ROOT, "tests")).split(os.sep)[0]
    return DEFAULT_MASTERS.get(folder, ("local",))


def pytest_addoption(parser):
    parser.addoption("--matrix", action="store_true", help="print which masters each test file runs on")


def pytest_configure(config):
    config.addinivalue_line("markers", "masters(*names): the passes (masters) a test runs on")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--matrix"):
        rows = {}
        for item in items:
            rows.setdefault(os.path.relpath(str(item.fspath), ROOT), {}).setdefault(_masters_of(item), 0)
            rows[os.path.relpath(str(item.fspath), ROOT)][_masters_of(item)] += 1
        print("\ntests per file and the masters they run on:")
        for path, by in sorted(rows.items()):
            print(f"  {path}: " + "; ".join(f"{n} on {'+'.join(m)}" for m, n in sorted(by.items())))
        return
    kept = [item for item in items if THIS_PASS in _masters_of(item)]
    dropped = [item for item in items if THIS_PASS not in _masters_of(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


# What each pass of ``make test`` may take on the 2-core reference machine, so that the whole of it
# fits 30 minutes (tests.md: "The suite's time"): the passes run one after another, the several-hosts
# pass beside the last two. Each pass prints its wall time against its budget; a pass over it does
# not fail (timings belong in benchmarks/) but says by how much, so a round that adds minutes sees it.
BUDGETS_S = {
    "local": 1050,
    "notebooks": 200,
    "connect": 220,
    "cluster": 130,
    "oldest": 90,
    "standalone": 110,
    "hosts": 200,  # beside oldest + standalone
}
SUITE_BUDGET_S = 1800
_STARTED = __import__("time").monotonic()


def budget_line(name: str, seconds: float) -> str:
    """``make test``'s line for a pass that took ``seconds``: its wall time against its budget."""
    budget = BUDGETS_S.get(name)
    if budget is None:
        return f"== time: pass {name!r} took {seconds:.0f} s (no budget: only make test's passes have one)"
    verdict = "within it" if seconds <= budget else f"OVER by {seconds - budget:.0f} s"
    return (
        f"== time: pass {name!r} took {seconds:.0f} s of its {budget} s budget ({verdict}; the budgets "
        f"add up to make test's {SUITE_BUDGET_S} s, tests/conftest.py BUDGETS_S)"
    )


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not config.getoption("--matrix"):
        ran = len(terminalreporter.stats.get("passed", [])) + len(terminalreporter.stats.get("failed", []))
        left = len(terminalreporter.stats.get("deselected", []))
        terminalreporter.write_line(
            f"== masters: this pass is {THIS_PASS!r}: {ran} tests ran here, {left} deselected "
            "(other passes, -m)"
        )
        if os.environ.get("SPARKML_DIST_WHOLE_PASS"):  # set by the Makefile's passes
            wall = __import__("time").monotonic() - _STARTED
            terminalreporter.write_line(budget_line(THIS_PASS, wall))
