"""What every benchmark here does the same way: run contenders interleaved, the order alternating
each round, the load average noted, and keep every wall time and each contender's last result."""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, List, Tuple


def interleaved(
    contenders: Dict[str, Callable[[], Any]], repeats: int
) -> Tuple[Dict[str, List[float]], dict]:
    """``(walls, last)``: the wall seconds of every round per contender, and its last result."""
    walls: Dict[str, List[float]] = {k: [] for k in contenders}
    last: Dict[str, Any] = {}
    for r in range(repeats):
        names = list(contenders) if r % 2 == 0 else list(contenders)[::-1]
        for name in names:
            load = os.getloadavg()[0]
            t = time.perf_counter()
            last[name] = contenders[name]()
            walls[name].append(time.perf_counter() - t)
            print(f"round {r} {name:18s} load {load:4.2f} wall {walls[name][-1]:7.2f}s", flush=True)
    return walls, last


def hosts_session(cluster, app_name: str, executors: int = 2):
    """A session on the several-hosts cluster (tests/support/hosts.py: ``Hosts(cores=1)``): the
    driver in its own namespace, one 1-core executor on each host, the repository's settings."""
    from sparkml_dist.session import get_session
    from tests.support.hosts import SPARK_CONF

    here = os.path.dirname(os.path.abspath(__file__))
    conf = dict(SPARK_CONF)
    conf.update(
        {
            "spark.driver.host": cluster.driver.address,
            "spark.driver.bindAddress": cluster.driver.address,
            "spark.executor.cores": "1",
            "spark.cores.max": str(executors),
            "spark.executor.memory": "1g",
            "spark.executorEnv.PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        }
    )
    spark = get_session(
        cluster.master_url,
        conf=conf,
        conf_file=os.path.join(os.path.dirname(here), "conf", "spark-local.yaml"),
        app_name=app_name,
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def local_session(app_name: str, memory: str = "6g"):
    """The benchmarks' SparkSession: local[2] with the repository's settings, executors (and rank
    processes) finding the benchmark modules on their path, Spark's own logging quiet."""
    from sparkml_dist.session import get_session

    here = os.path.dirname(os.path.abspath(__file__))
    path = here + os.pathsep + os.environ.get("PYTHONPATH", "")
    spark = get_session(
        "local[2]",
        conf_file=os.path.join(os.path.dirname(here), "conf", "spark-local.yaml"),
        conf={"spark.driver.memory": memory, "spark.executorEnv.PYTHONPATH": path},
        app_name=app_name,
    )
    spark.sparkContext.setLogLevel("ERROR")
    os.environ["PYTHONPATH"] = path
    return spark
