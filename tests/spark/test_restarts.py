"""Failures on a real standalone cluster (a master and two worker JVMs on loopback): a killed
executor mid-training is survived with max_restarts and the exact result; without restarts it is a
clear error within a bounded time with no rank process left.  Runs in the standalone pass
(``make test-standalone``, part of ``make test``)."""

import os
import time

import pytest
import torch

from sparkml_dist import WorkerError
from sparkml_dist.runner import BarrierRunner, checkpoint
from tests.conftest import masters
from tests.support import runner_helpers as h
from tests.support.runner_checks import assert_no_rank_left

KILLER = "tests.support.helpers.KillExecutorOnceClassifier"  # a test class: trusted by name to load

pytestmark = masters("standalone")


def test_killed_executor_restarts_from_the_checkpoint_with_the_exact_result(spark, tmp_path):
    reference = BarrierRunner(-2, timeout=120, checkpoint_dir=str(tmp_path / "ref")).run(
        h.train_with_checkpoints
    )
    lines = []
    t = time.time()
    out = BarrierRunner(
        2, timeout=400, max_restarts=1, checkpoint_dir=str(tmp_path / "run"), log_sink=lines.append
    ).run(
        h.train_with_checkpoints,
        crash_at=7,
        crash_once_marker=str(tmp_path / "killed"),
        crash_how="kill_executor",
    )
    took = time.time() - t
    assert (tmp_path / "killed").exists() and out["resumed_from"] == 6
    assert torch.equal(out["weight"], reference["weight"]) and torch.equal(out["bias"], reference["bias"])
    assert any("attempt 1 failed" in ln for ln in lines)
    assert took < 300, took
    print(f"kill -> restarted and finished in {took:.1f}s")
    assert_no_rank_left(within=30)


def test_killed_executor_without_restarts_fails_fast_and_leaves_nothing(spark, tmp_path):
    t = time.time()
    with pytest.raises(WorkerError):
        BarrierRunner(2, timeout=300, checkpoint_dir=str(tmp_path / "run")).run(
            h.train_with_checkpoints, crash_at=4, crash_how="kill_executor"
        )
    took = time.time() - t
    assert took < 120, took
    print(f"kill -> WorkerError in {took:.1f}s")
    assert checkpoint.latest_step(str(tmp_path / "run")) == 2  # what a later run would resume from
    assert_no_rank_left(within=30)


def test_ensemble_task_whose_executor_dies_mid_fit_is_retried_once_per_group(spark, tmp_path):
    """Spark retries the lost task on another executor; collection keeps exactly one member per
    group, equal to an undisturbed fit; the saved model commits every group once."""
    import json
    import os

    import numpy as np
    from pyspark.ml.linalg import Vectors
    from sklearn.datasets import make_classification
    from sklearn.tree import DecisionTreeClassifier

    from sparkml_dist.ensemble import BaggingClassificationModel, BaggingClassifier
    from tests.support.helpers import KillExecutorOnceClassifier

    X, y = make_classification(n_samples=400, n_features=5, random_state=0)
    df = spark.createDataFrame([(Vectors.dense(x), float(t)) for x, t in zip(X, y)], ["features", "label"])
    marker = str(tmp_path / "killed")
    kw = dict(numModels=4, sampling="bootstrap", sampleRatio=0.7, seed=3)
    t = time.time()
    retried = BaggingClassifier(estimator=KillExecutorOnceClassifier(marker=marker, max_depth=4), **kw).fit(
        df
    )
    took = time.time() - t
    assert os.path.exists(marker) and took < 240, took
    print(f"executor killed mid-fit -> task retried, fit done in {took:.1f}s")
    plain = BaggingClassifier(estimator=DecisionTreeClassifier(max_depth=4), **kw).fit(df)
    assert [m.group for m in retried.models] == [0, 1, 2, 3]
    assert np.array_equal(retried.predict_proba(X), plain.predict_proba(X))
    path = str(tmp_path / "model")
    retried.write().overwrite().save(path)
    manifest = json.loads(open(os.path.join(path, "data", "manifest.json")).read())
    stored = sorted(os.listdir(os.path.join(path, "data", "objects")))
    assert not [f for f in stored if "tmp" in f]  # nothing half-written
    loaded = BaggingClassificationModel.read().trusted_types([KILLER]).load(path)
    assert np.array_equal(loaded.predict_proba(X), plain.predict_proba(X))
    groups = [m["group"] for m in manifest["objects"]]
    assert sorted(groups) == [-1, 0, 0, 1, 1, 2, 2, 3, 3]  # the estimator; each member (record, model) once


def test_two_executors_lost_one_after_the_other_do_not_stop_an_elastic_run(spark, tmp_path):
    """Two lost machines look alike (the same JVM frames) but are no bug of the function: restarts
    go on past the second loss, each time from the latest checkpoint."""
    lines = []
    out = BarrierRunner(
        2, timeout=500, max_restarts=3, min_np=1, checkpoint_dir=str(tmp_path / "run"), log_sink=lines.append
    ).run(
        h.train_with_checkpoints,
        steps=15,
        crash_at=[4, 10],
        crash_once_marker=str(tmp_path / "killed"),
        crash_how="kill_executor",
    )
    assert (tmp_path / "killed.4").exists() and (tmp_path / "killed.10").exists()
    assert out["resumed_from"] == 9  # the checkpoint of step 8, after the second loss
    assert sum("attempt 1 failed" in ln or "attempt 2 failed" in ln for ln in lines) >= 2, lines[-10:]
    assert_no_rank_left(within=30)


def test_a_decommissioned_executor_hands_over_and_no_step_is_trained_twice(spark, tmp_path):
    """An executor under a rank is decommissioned (SIGPWR, as a spot reclaim or a scale-down sends)
    mid-run: the driver sees it, the ranks save at one agreed step and the run goes on from that
    checkpoint on the executors that stay, not counted against max_restarts.  Every step is trained
    once (counted on each rank), and the weights are an undisturbed run's.  ~65 s: two runs of 40
    steps of 0.2 s (long enough for the driver's twice-a-second watch) and a restart on the executor
    Spark starts in the decommissioned one's place."""
    reference = BarrierRunner(-2, timeout=120, checkpoint_dir=str(tmp_path / "ref")).run(
        h.train_through_a_decommission, str(tmp_path), notice_at=-1, marker=str(tmp_path / "none")
    )
    for r in (0, 1):
        (tmp_path / f"rank{r}.txt").unlink()
    lines = []
    out = BarrierRunner(
        2, timeout=400, max_restarts=1, checkpoint_dir=str(tmp_path / "run"), log_sink=lines.append
    ).run(h.train_through_a_decommission, str(tmp_path), marker=str(tmp_path / "noticed"))
    said = "".join(lines)
    print(said)
    assert (tmp_path / "noticed").exists() and "is being decommissioned" in said, said[-2000:]
    assert "handed over" in said and "attempt 1 failed" not in said, said[-2000:]
    handed_at = out["resumed_from"] - 1  # the step of the checkpoint the second attempt started from
    # after the notice (step 6) and before the last step: not the run's end, whatever the host's load
    assert 6 < handed_at < 39, handed_at
    for r in (0, 1):
        trained = [int(s) for s in (tmp_path / f"rank{r}.txt").read_text().split()]
        assert sorted(trained) == list(range(40)), (r, trained)  # each step once: none redone, none lost
    assert torch.equal(out["weight"], reference["weight"]) and torch.equal(out["bias"], reference["bias"])
    print(f"notice at step 6, handed over at step {handed_at}")
    assert_no_rank_left(within=30)


def _replaced_run(spark, tmp_path, kills):
    """``elastic_helpers.main`` over 64 staged rows (32 a rank, 8 a step), ``executor_loss="replace"``
    and ``kills``; checks that every step's global batch (by id) is one of the ranks' shards, each
    step once, and the model what one process computes on those batches; (what the console said,
    the ranks' start marks as "start-<rank>", the pids that started)."""
    import os

    import numpy as np

    from tests.support import elastic_helpers as eh

    rng = np.random.default_rng(0)
    rows = [(i, *map(float, rng.normal(size=4))) for i in range(64)]
    features = {r[0]: r[1:] for r in rows}
    df = spark.createDataFrame(rows, "id long, x0 double, x1 double, x2 double, x3 double").repartition(3)
    marks = tmp_path / "marks"
    marks.mkdir()
    lines = []
    runner = BarrierRunner(
        2,
        timeout=400,
        max_restarts=2,
        executor_loss="replace",
        staging_dir=str(tmp_path / "stage"),
        log_sink=lines.append,
    )
    out = runner.run_with_data(df, eh.main, str(marks), kills, True)
    text = "".join(lines)
    print(text[-3000:])
    seen = out["ranks"][0]["seen"]
    assert [s for s, _ in seen] == list(range(eh.STEPS))
    for rank in (0, 1):  # the rows of rank r at step s: its shard's, sorted by id, from s * 8 on
        shard = sorted({i for _, ids in seen for i in ids[rank]})
        assert len(shard) == 32, shard
        for step, ids in seen:
            assert ids[rank] == [shard[(step * 8 + j) % 32] for j in range(8)], (rank, step)
    for key, value in eh.one_process(2, features=features, seen=seen).items():
        assert torch.allclose(out["weights"][key], value, atol=1e-5), key
    names = os.listdir(marks)
    starts = sorted(n.rsplit("-", 1)[0] for n in names if n.startswith("start-"))
    pids = {int(n.rsplit("-", 1)[1]) for n in names if n.startswith("start-")}
    assert {r["pid"] for r in out["ranks"]} <= pids  # the ranks that finished are ones that started
    assert "attempt 1 failed" not in text
    return text, starts, marks


def test_executors_lost_inside_elastic_run_cost_only_their_own_ranks(spark, tmp_path):
    """``executor_loss="replace"``: rank 0's executor JVM is SIGKILLed at step 3, then rank 1's at
    step 7 (its Python side, its warm pool and its rank go with it).  Spark runs only the lost
    task again each time, on the executor the worker starts in its place; the new rank joins the
    other, which keeps its process (``main`` started 4 times in all: twice per rank, never a
    restart of everyone; the run's store is the driver's, so rank 0's loss is one like any
    other), no attempt fails, every step's global batch (by id) is one of the ranks' shards, each
    step once, and the model is what one process computes on those batches.  ~75 s: two new
    executors, their Python daemons and pools start."""
    text, starts, _ = _replaced_run(spark, tmp_path, [(0, 3, "executor"), (1, 7, "executor")])
    assert starts == ["start-0", "start-0", "start-1", "start-1"], starts  # each loss: its own rank
    assert text.count("lost with its executor") == 2, text[-2000:]
    assert "rank 0 rejoined at commit 3" in text and "rank 1 rejoined at commit 7" in text, text[-2000:]
    assert_no_rank_left(within=30)


def test_a_decommissioned_executor_hands_its_ranks_over_in_place_and_no_step_is_redone(spark, tmp_path):
    """``executor_loss="replace"`` with ``spark.decommission.enabled``: rank 0's executor is
    decommissioned (SIGPWR) at step 3 and rank 0 trains on.  The driver's watch tells its task;
    rank 0 leaves at its next commit, Spark runs its task again on the executor the worker starts,
    and the new rank 0 joins rank 1, which kept its process and went back to that same commit:
    each rank completed every step exactly once (none redone), the handover used none of
    max_restarts, and the model is what one process computes on the same global batches.  ~50 s:
    a new executor, its Python daemon and pool start."""
    import re

    text, starts, marks = _replaced_run(spark, tmp_path, [(0, 3, "decommission")])
    assert starts == ["start-0", "start-0", "start-1"], starts  # rank 1 kept its process
    for rank in (0, 1):
        done = [int(s) for s in (marks / f"done-{rank}").read_text().split()]
        assert done == list(range(12)), (rank, done)  # every step once, in order: none redone
    assert "is being decommissioned" in text and "rank 0 left its decommissioned executor" in text, text
    left = re.search(r"rank 0 leaves at commit (\d+)", text)
    assert left and f"rank 0 rejoined at commit {left.group(1)}" in text, text[-2000:]
    assert 3 < int(left.group(1)) < 12 and "lost with its executor" not in text
    assert_no_rank_left(within=30)


def test_a_rank_that_raises_under_executor_loss_replace_fails_the_run_without_spark_retries(spark, tmp_path):
    """Plain tasks are retried by Spark (``spark.task.maxFailures``), but a rank that raises is a
    bug, not a lost executor: the driver cancels the job at its report, so each attempt of the run
    starts the function once per rank (the run's restart, ``max_restarts=1``, is the only second
    start), and the error names rank 1 and its ValueError in both attempts."""
    import os

    from tests.support import elastic_helpers as eh

    marks = tmp_path / "marks"
    marks.mkdir()
    lines = []
    with pytest.raises(WorkerError) as caught:
        BarrierRunner(2, timeout=300, max_restarts=1, executor_loss="replace", log_sink=lines.append).run(
            eh.raises_inside, str(marks)
        )
    text = str(caught.value)
    assert caught.value.rank == 1 and "ValueError: injected bug at step 3" in caught.value.worker_traceback
    for attempt in (1, 2):
        assert f"attempt {attempt}: rank 1 exited with code 1 [ValueError: injected bug at step 3]" in text
    ran = sorted(n.rsplit("-", 1)[0] for n in os.listdir(marks))
    assert ran == ["ran-0", "ran-0", "ran-1", "ran-1"], ran  # one start per rank and attempt
    assert not any("lost with its executor" in ln for ln in lines)
    assert_no_rank_left(within=30)


def test_with_min_np_the_world_shrinks_in_place_and_grows_back_dealing_the_rows_again(spark, tmp_path):
    """``executor_loss="replace"``, ``min_np=1``, ``resize_wait=3``, the rows from the runner's
    loader over a Parquet scan (``streams=2``, ``global_batch_size=8``, the loader kept in the
    ``TorchState``): rank 1's executor JVM is SIGKILLed at step 3.  Rank 0 keeps its process:
    after 3 s without rank 1 it trains on alone (a generation of 1 rank), reading both streams
    from the next unseen batch on; when the worker's new executor runs rank 1's task again, the
    new rank 1 registers and joins at rank 0's next commit, and each reads its own stream again.
    Each step is trained once (counted in rank 0's own file), every step's global batch (by id) is
    the one an undisturbed run trains at that step, every complete epoch trains each of the 64 rows
    once, and the model is what one process computes on those batches.  ~70 s: a new executor,
    its Python daemon and pool start while rank 0 trains; the reference run on local processes."""
    import numpy as np

    from tests.support import elastic_helpers as eh

    rng = np.random.default_rng(0)
    rows = [(i, *map(float, rng.normal(size=4))) for i in range(64)]
    features = {r[0]: r[1:] for r in rows}
    path = str(tmp_path / "rows.parquet")
    schema = "id long, x0 double, x1 double, x2 double, x3 double"
    spark.createDataFrame(rows, schema).coalesce(1).write.parquet(path)
    df = spark.read.parquet(path)
    marks, again = tmp_path / "marks", tmp_path / "reference"
    marks.mkdir()
    again.mkdir()
    lines = []
    out = BarrierRunner(
        2,
        timeout=400,
        max_restarts=2,
        min_np=1,
        resize_wait=3,
        executor_loss="replace",
        log_sink=lines.append,
    ).run_with_data(df, eh.resizing_loader, str(marks), 3, streams=2)
    text = "".join(lines)
    print(text[-3000:])
    first, seen, sizes = (out["ranks"][0][k] for k in ("pid", "seen", "sizes"))
    shrunk = [i for i, n in enumerate(sizes) if n == 1]
    assert sizes[:3] == [2, 2, 2] and shrunk and shrunk[0] == 3 and sizes[-1] == 2, sizes
    assert shrunk == list(range(3, shrunk[-1] + 1))  # one stretch alone, then whole again
    starts = sorted(n for n in os.listdir(marks) if n.startswith("start-"))
    assert [n.rsplit("-", 1)[0] for n in starts] == ["start-0", "start-1", "start-1"], starts
    assert f"start-0-{first}" in starts  # rank 0 kept its process through both resizes
    done = (marks / f"done-{first}").read_text().split()
    assert [int(s) for s in done] == list(range(len(seen))), done  # every step once on rank 0
    assert "1 of 2 ranks (min_np=1)" in text and "(grown back)" in text, text[-2000:]
    assert f"rank 1 rejoined at commit {shrunk[-1] + 1}" in text and "attempt 1 failed" not in text
    reference = BarrierRunner(-2, timeout=200, max_restarts=1).run_with_data(
        df, eh.resizing_loader, str(again), -1, len(seen), streams=2
    )
    assert [sorted(sum(ids, [])) for _, ids in seen] == [
        sorted(sum(ids, [])) for _, ids in reference["ranks"][0]["seen"]
    ]  # the same global batch at every step, whatever the world trained it
    for epoch in range(len(seen) // 8):  # 8 steps of 8 rows an epoch
        ids = sorted(i for _, step in seen[epoch * 8 : epoch * 8 + 8] for r in step for i in r)
        assert ids == list(range(64)), epoch
    for key, value in eh.one_process(2, steps=len(seen), features=features, seen=seen).items():
        assert torch.allclose(out["weights"][key], value, atol=1e-5), key
    assert_no_rank_left(within=30)
