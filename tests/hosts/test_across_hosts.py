"""Everything across hosts: the driver, a master + worker and a second worker each in their own
network namespace with their own address (tests/support/hosts.py).  Loopback in one namespace is
not the other's, so anything that advertises or dials loopback across hosts fails here.

Runs in the several-hosts pass (``make test-hosts``, part of ``make test``)."""

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F
from sklearn.datasets import load_digits, make_classification
from sklearn.model_selection import GridSearchCV
from sklearn.tree import DecisionTreeClassifier

from sparkml_dist import tune
from sparkml_dist.ensemble import BaggingClassificationModel, BaggingClassifier, GlobalForestClassifier
from sparkml_dist.host.network import host_address
from sparkml_dist.runner import BarrierRunner
from sparkml_dist.search import ParallelSearchCV
from tests.conftest import ROOT
from tests.support import horovod_helpers as hvh
from tests.support import host_helpers as hh
from tests.support import ps_helpers as ps
from tests.support import runner_helpers as h
from tests.support import truth
from tests.support import tune_helpers as th
from tests.support.runner_checks import assert_no_rank_left

COLS = [f"f{i}" for i in range(6)]


def test_executors_run_on_two_hosts_and_advertise_their_own_addresses(spark, hosts):
    driver = hosts.driver.address  # these hosts have no default route: the driver's is the one
    where = spark.sparkContext.parallelize(range(16), 16).map(
        lambda _: (socket.gethostname(), host_address(toward=driver))
    )
    seen = set(where.collect())
    assert seen == {("host1", hosts["host1"].address), ("host2", hosts["host2"].address)}
    assert socket.gethostname() != "host1" and hosts.driver.address == spark.conf.get("spark.driver.host")


def test_ddp_ranks_on_two_hosts_rendezvous_at_a_real_address_and_stream_both_hosts_logs(spark, hosts):
    lines = []
    out = BarrierRunner(4, timeout=240, log_ranks="all", log_sink=lines.append, clean_work_dir=True).run(
        hh.where_am_i, return_all=True
    )
    by_host = {}
    for r in out:
        by_host.setdefault(r["host"], []).append(int(r["LOCAL_RANK"]))
        assert r["sum"] == 10.0 and r["WORLD_SIZE"] == "4" and r["LOCAL_WORLD_SIZE"] == "2"
    assert {k: sorted(v) for k, v in by_host.items()} == {"host1": [0, 1], "host2": [0, 1]}
    rank0_host = out[0]["host"]
    assert out[0]["MASTER_ADDR"] == hosts[rank0_host].address  # not loopback, not the driver
    assert out[0]["listens"] == [hosts[rank0_host].address]  # the store binds what it advertises
    text = "".join(lines)
    for r in out:
        assert f"rank {r['RANK']} on {r['host']} local_rank {r['LOCAL_RANK']}" in text
    assert_no_rank_left(within=30)


@pytest.fixture(scope="module")
def table(spark, tmp_path_factory):
    X, y = make_classification(n_samples=3000, n_features=6, n_informative=4, random_state=0)
    pdf = pd.DataFrame(X, columns=COLS)
    pdf["label"] = y.astype(float)
    return spark.createDataFrame(pdf).repartition(8), X


def test_bagging_fit_transform_save_load_across_hosts(spark, table, tmp_path):
    df, X = table
    est = BaggingClassifier(
        estimator=DecisionTreeClassifier(max_depth=5), numModels=6, featuresCols=COLS, seed=3
    )
    model = est.fit(df)
    scored = model.transform(df).select(*COLS, "probability").toPandas()
    path = str(tmp_path / "bag")
    model.write().overwrite().save(path)
    loaded = BaggingClassificationModel.load(path)
    local = loaded.predict_proba(scored[COLS].to_numpy())
    assert len(model.models) == 6
    assert np.allclose(np.stack(scored["probability"].map(lambda v: v.toArray())), local)
    again = BaggingClassifier(
        estimator=DecisionTreeClassifier(max_depth=5), numModels=6, featuresCols=COLS, seed=3
    ).fit(df.repartition(3))
    assert np.array_equal(again.predict_proba(X), model.predict_proba(X))  # the same whatever the layout


def test_a_global_forest_grows_every_tree_from_both_hosts_rows(spark, table):
    """XGBoost's tracker listens on rank 0's host address and the ranks of the other host join it:
    a tracker or a worker on loopback would never meet here."""
    df, X = table
    est = GlobalForestClassifier(numTrees=4, maxDepth=5, featuresCols=COLS, numWorkers=4, seed=3)
    model = est.fit(df)
    assert model.groupSizes == [3000]
    again = est.fit(df.repartition(2))
    assert np.array_equal(again.predict_proba(X), model.predict_proba(X))
    assert_no_rank_left(within=30)


def test_parallel_search_across_hosts_matches_scikit_learn(spark, hosts):
    X, y = load_digits(return_X_y=True)
    grid = {"max_depth": [4, 8], "min_samples_leaf": [1, 5]}
    ref = GridSearchCV(DecisionTreeClassifier(random_state=0), grid, cv=3).fit(X, y)
    ours = ParallelSearchCV(DecisionTreeClassifier(random_state=0), grid, cv=3).fit(X, y)
    assert ours.best_params_ == ref.best_params_
    assert np.allclose(ours.cv_results_["mean_test_score"], ref.cv_results_["mean_test_score"])


def test_tuner_with_four_trials_across_hosts(spark, hosts):
    space = {"x": [0.0, 0.3, 0.6, 0.9], "steps": 3, "pause": 0.02}
    result = tune.Tuner(th.curve, space, metric="loss", sampler="grid", max_trials=4, progress=False).run()
    assert sorted(result.trials["params_x"]) == [0.0, 0.3, 0.6, 0.9]
    assert result.best_params["x"] == 0.3


@pytest.mark.parametrize("source", ["parquet", "spark", "staged"])
def test_run_with_data_deals_every_row_once_across_hosts(spark, hosts, tmp_path, source):
    df = spark.range(0, 4000, 1, 5).selectExpr("cast(id as double) as x")
    if source == "parquet":
        df.write.parquet(str(tmp_path / "t"))
        df = spark.read.parquet(str(tmp_path / "t"))
    else:
        df = df.withColumn("x", df.x * 1.0)  # computed: no files to read
    # a cluster master: a computed DataFrame is dealt through Spark unless a staging directory
    # every host reaches is given (the hosts share this file system, as a mount would)
    stage = str(tmp_path / "stage") if source == "staged" else None
    out = BarrierRunner(4, timeout=240, clean_work_dir=True, staging_dir=stage).run_with_data(
        df, h.shard_summary, 32, return_all=True
    )
    values = sorted(v for r in out for v in r["values"])
    assert values == [float(i) for i in range(4000)]
    assert sorted(r["rows"] for r in out) == [1000] * 4
    if stage:
        assert os.listdir(stage) == []  # written, read by the four ranks, removed


def test_horovod_across_hosts(spark, hosts):
    out = BarrierRunner(4, backend="horovod", timeout=240, clean_work_dir=True).run(
        hvh.collectives, return_all=True
    )
    assert [o["rank"] for o in out] == [0, 1, 2, 3]
    assert all(o["sum"] == 10.0 and o["size"] == 4 for o in out)
    assert sorted((o["cross_size"], o["local_size"]) for o in out) == [(2, 2)] * 4  # two hosts of two


def test_a_parameter_server_strategy_fit_across_hosts_ends_with_its_servers(spark, hosts):
    """TensorFlow's parameter-server tutorial (model.fit on a DatasetCreator) as four barrier tasks:
    the chief, two workers and a parameter server, on both hosts' addresses; the servers end with
    the chief's function (the job ends, no rank is left)."""
    out = BarrierRunner(2, backend="tensorflow", roles={"ps": 1}, timeout=300).run(ps.keras_fit)
    cluster = out["tf_config"]["cluster"]
    addresses = {a.rsplit(":", 1)[0] for role in cluster.values() for a in role}
    assert addresses == {hosts["host1"].address, hosts["host2"].address}, cluster
    assert [len(cluster[r]) for r in ("chief", "worker", "ps")] == [1, 2, 1]
    assert out["loss"][-1] < out["loss"][0] / 100, out["loss"]
    assert_no_rank_left()


def test_reduction_servers_across_hosts_train_what_the_ring_trains(spark, hosts):
    """Two workers and two reduction servers as four barrier tasks on both hosts, the rows of a
    computed DataFrame dealt through Spark to the workers only: every row once an epoch, and the
    weights the ring's DDP trains on the same rows."""
    df = spark.createDataFrame(truth.frame(100)).withColumn("y", F.col("y") * 1.0)  # no files: Spark deals
    programs = [("ddp", "torch_ddp", 8, {})]
    ring = BarrierRunner(2, timeout=240).run_with_data(df, truth.several, programs, 2)["ddp"]
    runner = BarrierRunner(2, comm={"reduction_servers": 2}, timeout=240, log_ranks="none")
    workers = [r["ddp"] for r in runner.run_with_data(df, truth.several, programs, 2, return_all=True)]
    assert len(workers) == 2  # the servers run no function
    assert sorted(i for w in workers for step in w["steps"] for i in step) == sorted(list(range(100)) * 2)
    expected = {k: np.asarray(v, "float64") for k, v in ring["weights"].items()}
    assert truth.difference(workers[0]["weights"], expected) < 1e-5
    assert_no_rank_left()


def test_cli_runs_a_torchrun_script_with_ranks_on_both_hosts(spark, hosts, tmp_path):
    conf = tmp_path / "spark.yaml"
    conf.write_text(
        "\n".join(
            f'{k}: "{v}"'
            for k, v in {
                "spark.driver.host": hosts.driver.address,
                "spark.driver.bindAddress": hosts.driver.address,
                "spark.executor.cores": "1",
                "spark.cores.max": "2",  # a core on each worker: the test session holds the rest
                "spark.executor.memory": "512m",
                "spark.ui.enabled": "false",
                "spark.executorEnv.PYTHONPATH": ROOT,
                "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1",
            }.items()
        )
    )
    script = tmp_path / "where.py"
    script.write_text(
        "import os, socket\nimport torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = __import__('torch').ones(1)\ndist.all_reduce(t)\n"
        "print(f\"rank {os.environ['RANK']} of {int(t)} on {socket.gethostname()} "
        "master {os.environ['MASTER_ADDR']}\")\n"
        "dist.destroy_process_group()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "sparkml_dist", "run", "--np", "2", "--master", hosts.master_url]
        + ["--spark-conf", str(conf), str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
        env=dict(os.environ, PYSPARK_PYTHON=sys.executable),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = {ln.split(" on ")[1].split()[0] for ln in proc.stdout.splitlines() if " of 2 on " in ln}
    assert ranks == {"host1", "host2"}, proc.stdout[-2000:]
    assert "master 127." not in proc.stdout
    # ranks on other machines than the driver's run in a kept directory there (torchrun's rule),
    # which the command says; this test removes it
    kept = re.findall(r"working directory on \S+: (\S+) \(kept after the run\)", proc.stdout + proc.stderr)
    assert kept, proc.stdout[-2000:]
    for path in set(kept):
        shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))


def test_the_harness_tears_everything_down_after_a_failure(hosts):
    from tests.support.hosts import Hosts

    other = Hosts(spark=False)
    with pytest.raises(RuntimeError, match="a test failed"):
        with other:
            assert len(other.leftovers()) >= 4  # namespaces, links, /etc/netns entries exist now
            raise RuntimeError("a test failed")
    assert other.leftovers() == []
