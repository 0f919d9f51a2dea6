"""GlobalForestClassifier / Regressor: one XGBoost forest grown across the ranks of a barrier job
(real Spark barrier tasks, real XGBoost collective), as a pyspark.ml stage."""

import os

import numpy as np
import pandas as pd
import pytest
from pyspark.ml.linalg import Vectors
from sklearn.datasets import make_classification, make_regression
from sklearn.metrics import r2_score, roc_auc_score

from sparkml_dist.ensemble import (
    BaggingClassificationModel,
    BaggingClassifier,
    BaggingRegressionModel,
    GlobalForestClassifier,
    GlobalForestRegressor,
)
from sparkml_dist.errors import ConfigurationError
from tests.conftest import masters

pytestmark = masters("local", "connect")  # a user of the runner: the runner itself is tested on every master

COLS = [f"f{i}" for i in range(8)]


@pytest.fixture(scope="module")
def binary(spark):
    X, y = make_classification(n_samples=3000, n_features=8, n_informative=5, random_state=3)
    pdf = pd.DataFrame(X, columns=COLS)
    pdf["label"] = y.astype(float) * 3 + 1  # labels 1 and 4: the classes are the label's values
    return X, pdf["label"].to_numpy(), spark.createDataFrame(pdf)


def test_every_tree_sees_every_row_and_the_model_is_a_bagging_model(binary, tmp_path):
    X, y, df = binary
    est = GlobalForestClassifier(numTrees=8, maxDepth=6, featuresCols=COLS, numWorkers=2, seed=5)
    model = est.fit(df.repartition(3))
    assert isinstance(model, BaggingClassificationModel) and model.classes == (1.0, 4.0)
    assert model.groupSizes == [3000]  # one member: the forest, fitted on every row
    forest = model.models[0].model
    assert forest.get_booster().num_boosted_rounds() == 1 and len(forest.get_booster().get_dump()) == 8
    proba = model.predict_proba(X)
    assert roc_auc_score(y == 4.0, proba[:, 1]) > 0.9
    scored = model.transform(df).toPandas()
    assert np.allclose(np.stack(scored["probability"].map(lambda v: v.toArray())), proba, atol=1e-6)
    again = est.fit(df.repartition(1))  # the same rows and seed: the same forest
    assert np.array_equal(again.predict_proba(X), proba)
    path = str(tmp_path / "forest")
    model.write().overwrite().save(path)
    assert np.array_equal(BaggingClassificationModel.load(path).predict_proba(X), proba)


def test_multiclass_vectors_and_a_regressor(spark):
    X, y = make_classification(n_samples=1500, n_features=6, n_informative=4, n_classes=3, random_state=1)
    vdf = spark.createDataFrame([(Vectors.dense(x), float(t)) for x, t in zip(X, y)], ["features", "label"])
    est = BaggingClassifier.forest(strategy="global", numTrees=4, maxDepth=5, numWorkers=2)
    assert isinstance(est, GlobalForestClassifier)
    model = est.fit(vdf)
    assert model.classes == (0.0, 1.0, 2.0) and (model.predict(X) == y).mean() > 0.7
    Xr, yr = make_regression(n_samples=1500, n_features=6, noise=5.0, random_state=2)
    rdf = spark.createDataFrame(pd.DataFrame(Xr, columns=COLS[:6]).assign(label=yr))
    reg = GlobalForestRegressor(numTrees=8, maxDepth=8, featuresCols=COLS[:6], numWorkers=2).fit(rdf)
    assert isinstance(reg, BaggingRegressionModel) and r2_score(yr, reg.predict(Xr)) > 0.6


def test_bad_input_is_refused_by_name_before_the_barrier_job(spark, binary):
    _, _, df = binary
    with pytest.raises(ConfigurationError, match="subsamplingRate must be in"):
        GlobalForestClassifier(subsamplingRate=0.0, featuresCols=COLS).fit(df)
    with pytest.raises(ConfigurationError, match="maxBins=5000 is more than the 3000 rows"):
        GlobalForestClassifier(maxBins=5000, featuresCols=COLS, numWorkers=2).fit(df)
    wide = spark.createDataFrame(  # hashed text: sparse vectors XGBoost's matrix would hold dense
        [(Vectors.sparse(2**28, [i], [1.0]), float(i % 2)) for i in range(20)], ["features", "label"]
    )
    with pytest.raises(ConfigurationError, match="ranks would hold 20 rows x 268435456 features dense"):
        GlobalForestClassifier(numWorkers=1, maxBins=2).fit(wide)
    continuous = df.withColumn("label", df["f0"])
    with pytest.raises(ConfigurationError, match="labelCol='label' has more than maxClasses=1000"):
        GlobalForestClassifier(featuresCols=COLS, numWorkers=2).fit(continuous)


def _listening_ports():
    """Ports this test process's own Python processes listen on (its Spark workers, ranks and
    pools: they carry its suite id), not a neighbour's: pytest-xdist runs another test beside this
    one, and an idle connection to that test's Horovod ranks once failed it."""
    import psutil

    from tests.support.runner_checks import SUITE_ENV

    def ours(pid):
        try:
            p = psutil.Process(pid)
            return "java" not in p.name() and p.environ().get(SUITE_ENV) == os.environ[SUITE_ENV]
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False

    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.pid and ours(c.pid)
    }


@masters("local")  # rank processes on this machine: where a test can reach every port they open
def test_an_idle_connection_to_every_port_the_ranks_open_never_hangs_the_fit(spark, binary):
    """A port scanner's idle connection to each port the fit's ranks listen on: the fit finishes,
    or fails within collectiveTimeout naming XGBoost's tracker port or the worker it stopped."""
    import socket
    import threading
    import time

    from sparkml_dist.errors import WorkerError

    _, _, df = binary
    before, held, done = _listening_ports(), [], threading.Event()

    def scan():
        seen = set()
        while not done.wait(0.05):
            for ip, port in _listening_ports() - before - seen:
                seen.add((ip, port))
                try:
                    held.append(
                        (port, socket.create_connection(("127.0.0.1" if ip == "0.0.0.0" else ip, port)))
                    )
                except OSError:
                    pass

    scanner = threading.Thread(target=scan, daemon=True)
    scanner.start()
    est = GlobalForestClassifier(
        numTrees=4, maxDepth=4, featuresCols=COLS, numWorkers=2, collectiveTimeout=10
    )
    start = time.monotonic()
    try:
        model = est.fit(df)
        outcome = f"finished with {len(model.models)} member"
    except WorkerError as exc:
        outcome = str(exc)
        assert ("XGBoost's collective (tracker" in outcome and "collectiveTimeout=10s" in outcome) or (
            "XGBoost stopped that rank's worker" in outcome
        ), outcome[:2000]
        if "tracker" in outcome.split("\n")[0]:
            assert any(f":{port})" in outcome for port, _ in held), outcome[:2000]  # the port is named
    finally:
        done.set()
        scanner.join()
        for _, s in held:
            s.close()
    took = time.monotonic() - start
    assert held and took < 10 + 60, (took, outcome[:300])
    print(f"{len(held)} idle connections held: {outcome.splitlines()[0][:200]} in {took:.1f}s")
