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
                {"spark.executor.cores": "1", "spark.cores.max": "2", "spark.executor.memory": "768m"}
            )
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


only_local = pytest.mark.skipif(
    MASTER != "local[2]", reason="starts its own local Spark; run in the local[2] pass"
)

# What separate executor JVMs cannot change (checks before any job, Spark SQL alone, MLflow on the
# driver) runs on local[2] and Connect, not again on local-cluster: each behaviour on the masters
# where it can differ, so the suite stays within CI's time.
not_on_cluster = pytest.mark.skipif(
    IS_CLUSTER, reason="cannot differ with separate executor JVMs: runs in the local[2] and Connect passes"
)

# What Spark Connect cannot change (what ranks do once launched: collectives, pipelines, Horovod;
# the launch, data path and errors through Connect are tested by tests/spark/test_runner.py there)
# runs on local[2] and local-cluster, not again over Connect.
not_on_connect = pytest.mark.skipif(
    IS_CONNECT, reason="cannot differ over Spark Connect: runs in the local[2] and local-cluster passes"
)

# What no master can change (model arithmetic, Optuna's samplers and pruners, checks of files on the
# driver): runs in the local[2] pass only; the Spark paths they share are tested on every master.
master_independent = pytest.mark.skipif(
    MASTER != "local[2]", reason="no master can change it: runs in the local[2] pass"
)
