"""BarrierRunner on Spark barrier tasks (np > 0): the shared checks plus data feeding and slots."""

import time

import numpy as np
import pytest
from pyspark.sql import functions as F

from sparkml_dist import ConfigurationError, InsufficientResourcesError, RunTimeoutError
from sparkml_dist.runner import BarrierRunner
from tests.conftest import masters
from tests.support import runner_helpers as h
from tests.support.runner_checks import RunnerChecks, assert_no_rank_left


@masters("local", "connect", "cluster")  # what separate executor JVMs can change
class TestSparkRunner(RunnerChecks):
    np_sign = 1


@pytest.fixture(scope="module")
def numbers(spark):
    return spark.range(0, 1000).select(F.col("id").cast("double").alias("x"))


@masters("local", "connect", "cluster", "oldest")  # what separate executor JVMs can change
@pytest.mark.parametrize("layout", ["1 partition", "3 partitions", "7 partitions", "skewed + empty"])
def test_every_row_reaches_exactly_one_rank_and_steps_are_equal(numbers, layout):
    if layout == "skewed + empty":
        df = numbers.repartition(4, (F.col("x") < 950).cast("int")).where("x >= 0")  # one huge, some empty
    else:
        df = numbers.repartition(int(layout.split()[0]))
    out = BarrierRunner(2, timeout=180).run_with_data(df, h.shard_summary, 32, return_all=True)
    values = sorted(v for r in out for v in r["values"])
    assert values == [float(i) for i in range(1000)]  # no row lost or duplicated
    assert out[0]["steps"] == out[1]["steps"] == int(np.ceil(max(r["rows"] for r in out) / 32))
    assert [r["rows"] for r in out] == [500, 500]  # dealt, not hashed: exactly balanced


def test_duplicate_rows_are_spread_over_the_ranks(spark):
    # 1001 rows holding 3 distinct values: hashing rows by content put every copy on one rank
    df = spark.range(0, 1001).select((F.col("id") % 3).cast("double").alias("x"))
    out = BarrierRunner(2, timeout=180).run_with_data(df, h.shard_summary, 100, return_all=True)
    assert sorted(r["rows"] for r in out) == [500, 501]
    assert sorted(v for r in out for v in r["values"]) == sorted(float(i % 3) for i in range(1001))
    assert all(set(r["values"]) == {0.0, 1.0, 2.0} for r in out)


@masters("local", "cluster")
def test_a_big_shard_reaches_each_rank_whole_within_the_data_timeout(spark):
    # 4M rows of 4 doubles per rank (128 MB): streamed, sorted and spilled in the barrier task,
    # bounded by data_timeout (progress), not by start_timeout.  That the rendezvous deadline starts
    # only when the shard is written is shown deterministically (a shard trickling in for 5 s against
    # start_timeout=2 s) by tests/unit/test_runner_parts.py; here a tight start_timeout only measured
    # how fast the machine was (the data phase takes 1-10 s with the load)
    cols = [(F.col("id") * (i + 1)).cast("double").alias("x" if i == 0 else f"c{i}") for i in range(4)]
    df = spark.range(0, 8_000_000, 1, 4).select(*cols)
    runner = BarrierRunner(2, start_timeout=60, data_timeout=60, timeout=300)
    out = runner.run_with_data(df, h.shard_columns, return_all=True)
    assert [o["rows"] for o in out] == [4_000_000] * 2 and out[0]["columns"] == ["x", "c1", "c2", "c3"]
    assert_no_rank_left()


def test_the_exact_deal_gives_shards_that_do_not_depend_on_input_partitioning(numbers):
    exact = BarrierRunner(2, read_files=False)  # the default stages the rows in their computed order
    a = exact.run_with_data(numbers.repartition(1), h.shard_summary, return_all=True)
    b = exact.run_with_data(numbers.repartition(5), h.shard_summary, return_all=True)
    assert [r["values"] for r in a] == [r["values"] for r in b]


def test_shards_and_batches_go_to_the_device_asked_for(numbers):
    df = numbers.withColumn("y", F.col("x") * 2)
    out = BarrierRunner(2, timeout=180).run_with_data(df, h.shard_on_device, "meta", return_all=True)
    for r in out:  # "meta" stands in for the rank's GPU: the tensors are moved, pinning is skipped
        assert r["to_torch"] == "meta" and r["batch"] == ["meta", "meta"] and r["shape"][1] == 2
    assert sum(r["shape"][0] for r in out) == 1000


def test_tiny_data_still_gives_every_rank_rows(spark):
    df = spark.range(0, 3).select(F.col("id").cast("double").alias("x"))
    out = BarrierRunner(2).run_with_data(df, h.shard_summary, 2, return_all=True)
    assert sorted(r["rows"] for r in out) == [1, 2]
    assert out[0]["steps"] == out[1]["steps"] == 1
    with pytest.raises(ConfigurationError, match="fewer than np=2 ranks"):
        BarrierRunner(2).run_with_data(df.limit(1), h.shard_summary)


def test_too_many_ranks_fails_before_launching(spark):
    started = time.monotonic()  # local-cluster used to wait start_timeout (180 s) for slots it never gets
    with pytest.raises(
        InsufficientResourcesError, match=r"np=5 barrier tasks need 5 task slots but the cluster has 2"
    ):
        BarrierRunner(5).run(h.allreduce_rank_sum)
    assert time.monotonic() - started < 30
    assert_no_rank_left()


def test_ctrl_c_stops_this_run_and_only_this_run(spark):
    import os
    import signal
    import threading

    # another job of the same SparkContext, queued behind the run's two barrier tasks: PySpark's
    # own SIGINT handler (cancelAllJobs) killed it with the run
    slow = F.udf(lambda x: time.sleep(0.005) or x, "double")
    other, box = spark.range(0, 400, 1, 2).select(slow(F.col("id").cast("double")).alias("v")), []

    def bystander():
        time.sleep(2)
        try:
            box.append(sum(r["v"] for r in other.collect()))
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion
            box.append(exc)

    thread = threading.Thread(target=bystander)
    timer = threading.Timer(5.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    thread.start()
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            BarrierRunner(2, timeout=300).run(h.sleep_before_init, 0, 120)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 60
    thread.join(120)
    assert box == [float(sum(range(400)))]  # the bystander's job ran to its end
    assert_no_rank_left(within=20)


@masters("local", "connect", "cluster")  # what separate executor JVMs can change
def test_a_cancelled_run_leaves_no_process_and_no_work_directory(spark, tmp_path):
    import json
    import os
    import signal
    import threading

    info, over = tmp_path / "ranks.jsonl", threading.Event()

    def ctrl_c_once_both_ranks_hang():  # as a notebook user interrupts the cell
        while not over.wait(0.2):
            if info.exists() and len(info.read_text().splitlines()) == 2:  # both past the rendezvous
                os.kill(os.getpid(), signal.SIGINT)
                return

    watcher = threading.Thread(target=ctrl_c_once_both_ranks_hang, daemon=True)
    watcher.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            BarrierRunner(2, timeout=300).run(h.spawn_and_hang, str(info))
    finally:
        over.set()
        watcher.join()
    ranks = [json.loads(line) for line in info.read_text().splitlines()]
    assert len(ranks) == 2

    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                return fh.read().split(")")[-1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    end = time.monotonic() + 20
    while time.monotonic() < end and any(alive(r["child"]) or os.path.exists(r["cwd"]) for r in ranks):
        time.sleep(0.2)
    assert not [r["child"] for r in ranks if alive(r["child"])], "a process a rank started outlived the run"
    assert not [r["cwd"] for r in ranks if os.path.exists(r["cwd"])], "a rank's work directory was left"
    assert_no_rank_left()


def test_timeout_bounds_the_planning_jobs_too(spark):
    slow = F.udf(lambda x: time.sleep(0.02) or x, "double")  # ~20 s to compute the rows
    df = spark.range(0, 2000, 1, 2).select(slow(F.col("id").cast("double")).alias("x"))
    started = time.monotonic()
    with pytest.raises(RunTimeoutError, match=r"timeout=3s while dealing the DataFrame's rows to ranks"):
        BarrierRunner(2, timeout=3).run_with_data(df, h.shard_columns)
    assert time.monotonic() - started < 15
    assert_no_rank_left()


def test_use_gpu_without_gpus_is_refused_before_launching(spark):
    with pytest.raises(InsufficientResourcesError, match="use_gpu=True"):
        BarrierRunner(2, use_gpu=True).run(h.allreduce_rank_sum)


@masters("local", "connect")  # local masters only (clusters: the e2e fake discovery test)
def test_local_master_gives_each_barrier_task_one_of_the_drivers_gpus(spark, monkeypatch):
    # local mode schedules no task resources: a single-GPU-box user's `local[*]` must still work
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    out = BarrierRunner(2, spark=spark, use_gpu=True, timeout=120).run(h.gpu_view, return_all=True)
    assert [o["cuda_visible"] for o in out] == ["1,0", "1,0"]  # torchrun's rule: the host's GPUs
    assert [o["picked"] for o in out] == ["1", "0"] and [o["device"] for o in out] == ["cuda:0", "cuda:1"]
    assert_no_rank_left()
    # executors' GPU memory comes from the conf (the driver cannot ask their devices)
    spark.conf.set("spark.sparkml_dist.gpu.memory", "1g")
    try:
        with pytest.raises(
            InsufficientResourcesError, match=r"a GPU has 1.00 GiB \(spark.sparkml_dist.gpu.memory\)"
        ):
            BarrierRunner(2, spark=spark, use_gpu=True, model_bytes=2 << 30).run(h.gpu_view)
    finally:
        spark.conf.unset("spark.sparkml_dist.gpu.memory")


@masters("cluster")  # needs executor JVMs to kill
def test_executor_jvm_killed_mid_training_fails_fast(spark):
    """an executor dies under a rank: a bounded failure, no rank left behind."""
    import time

    from sparkml_dist import WorkerError

    t = time.time()
    with pytest.raises(WorkerError):
        BarrierRunner(2, timeout=240).run(h.kill_my_executor, 2)
    assert time.time() - t < 120
    assert_no_rank_left(within=30)


def test_a_model_too_big_for_a_worker_is_refused_before_launching(spark):
    from sparkml_dist.plan import model_bytes

    need = model_bytes(2 * 10**12, precision="fp32", backprop=True)  # 2 T parameters
    with pytest.raises(InsufficientResourcesError, match=r"one model needs about .* MiB but an executor"):
        BarrierRunner(2, model_bytes=need).run(h.allreduce_rank_sum)
    assert_no_rank_left()


def test_output_of_ranks_that_are_not_streamed_is_kept_in_log_dir(spark, tmp_path):
    runner = BarrierRunner(2, spark=spark, log_ranks="none", log_dir=str(tmp_path), timeout=180)
    assert runner.run(h.chatty, fail_rank=-1, long_bytes=10, progress=3, numbered=50) == 0
    logs = sorted(tmp_path.iterdir())
    assert [p.name.split("-")[0] for p in logs] == ["rank0", "rank1"]
    for r, path in enumerate(logs):
        text = path.read_text()
        assert all(f"line {i} of rank {r}" in text for i in range(50)) and "progress 3/3" in text
    assert_no_rank_left()


def test_columns_spark_cannot_hash_are_named_before_any_job(spark):
    df = spark.range(0, 200).selectExpr(
        "cast(id as double) as x",
        "map('k', id) as tags",
        "named_struct('a', id, 'm', map('k', id)) as nested",
        """parse_json('{"a": 1}') as doc""",
    )
    cases = (("tags", "map<string,bigint>"), ("nested", "map<string,bigint>"), ("doc", "variant"))
    for column, kind in cases:
        others = [c for c in ("tags", "nested", "doc") if c != column]
        with pytest.raises(ConfigurationError, match=f"column '{column}' holds {kind} values"):
            BarrierRunner(2, spark=spark, read_files=False).run_with_data(df.drop(*others), h.shard_columns)
    # a struct of plain values hashes fine: every row reaches a rank, the struct intact
    plain = spark.range(0, 200).selectExpr("cast(id as double) as x", "named_struct('a', id, 'b', 'v') as s")
    out = BarrierRunner(2, spark=spark, timeout=180).run_with_data(plain, h.shard_columns, return_all=True)
    assert [o["columns"] for o in out] == [["x", "s"]] * 2 and sum(o["rows"] for o in out) == 200


def test_vector_columns_reach_the_ranks_as_arrays_and_a_too_wide_one_is_refused(spark):
    """A VectorAssembler's dense vectors and a HashingTF's sparse ones: (n, d) arrays on the ranks,
    every row once; a hashed space too wide to hold dense is refused on the driver, by name."""
    from pyspark.ml.feature import HashingTF, VectorAssembler

    df = spark.range(0, 60).selectExpr("cast(id as double) as a", "cast(id * 2 as double) as b", "id")
    assembled = VectorAssembler(inputCols=["a", "b"], outputCol="features").transform(df)
    out = BarrierRunner(2, spark=spark, timeout=180).run_with_data(
        assembled.select("features"), h.shard_matrix, "features", return_all=True
    )
    rows = sorted(tuple(r) for o in out for r in o["rows"])
    assert [o["shape"][1] for o in out] == [2, 2] and rows == [(float(i), 2.0 * i) for i in range(60)]
    words = spark.createDataFrame([(["a", "b"],), (["b", "c"],)] * 10, "words array<string>")
    small = HashingTF(numFeatures=16, inputCol="words", outputCol="tf").transform(words)
    out = BarrierRunner(2, spark=spark, timeout=180).run_with_data(
        small.select("tf"), h.shard_matrix, "tf", return_all=True
    )
    assert sum(o["shape"][0] for o in out) == 20 and all(sum(r) == 2.0 for o in out for r in o["rows"])
    wide = HashingTF(numFeatures=1 << 18, inputCol="words", outputCol="tf").transform(words)
    with pytest.raises(ConfigurationError, match=r"column 'tf' holds vectors of 262144 entries.*numFeatures"):
        BarrierRunner(2, spark=spark).run_with_data(wide, h.shard_matrix, "tf")  # its declared width
    from pyspark.ml.linalg import Vectors

    bare = spark.createDataFrame([(Vectors.sparse(1 << 18, [0], [1.0]),)] * 4, ["v"])  # no ml_attr
    with pytest.raises(ConfigurationError, match=r"column 'v' holds vectors of 262144 entries"):
        BarrierRunner(2, spark=spark).run_with_data(bare, h.shard_matrix, "v")  # its rows' width


def test_np_auto_takes_every_task_slot(spark):
    from sparkml_dist import _spark_env

    runner = BarrierRunner("auto", spark=spark)
    slots = _spark_env.master_slots(_spark_env.master_of(spark), _spark_env.conf_of(spark))
    assert runner.world_size == (slots or _spark_env.registered_slots(spark)) and runner.np > 0


@masters("local")  # it sets the driver JVM's own SparkConf, which a Connect client cannot reach
def test_return_all_results_over_max_result_size_are_refused_with_the_fix(spark):
    # Spark's driver checks the results' total as they arrive (no extra round among the tasks):
    # 2 x 2.5 MB fits each rank's share of spark.driver.maxResultSize=4m, not the two together
    from sparkml_dist import WorkerError

    conf = spark.sparkContext._jsc.sc().conf()  # the live SparkConf: a job's TaskSetManager reads it
    before = conf.get("spark.driver.maxResultSize", "1g")
    conf.set("spark.driver.maxResultSize", "4m")
    try:
        with pytest.raises(WorkerError) as caught:
            BarrierRunner(2, timeout=120).run(h.big_result, 2_500_000, return_all=True)
        message = str(caught.value)
        assert "spark.driver.maxResultSize (4.0 MiB)" in message and "ModelStore" in message
        out = BarrierRunner(2, timeout=120).run(h.big_result, 1_000_000, return_all=True)
        assert [len(r) for r in out] == [1_000_000, 1_000_000]
    finally:
        conf.set("spark.driver.maxResultSize", before)


@masters("local", "connect", "cluster")
def test_once_every_task_reached_the_driver_later_runs_exchange_through_it(spark):
    # Spark's allGather costs a task ~1 s (it polls once a second); a session whose tasks all
    # reached the driver's channel exchanges through it from then on (the path every later test
    # of the pass takes), and a run on it gets the same world
    from sparkml_dist import _spark_env
    from sparkml_dist.runner import peer_exchange

    assert BarrierRunner(2, timeout=180).run(h.allreduce_rank_sum, 1)["sum"] == 3.0
    assert peer_exchange.mode(spark, _spark_env.driver_host(spark)) == "driver"
    both = BarrierRunner(2, timeout=180).run(h.allreduce_rank_sum, 1, return_all=True)
    assert [b["sum"] for b in both] == [3.0, 3.0] and [b["env"]["RANK"] for b in both] == ["0", "1"]


@masters("local", "cluster")
def test_elastic_run_replaces_a_killed_rank_of_a_spark_task_and_ends_with_the_same_model(spark, tmp_path):
    """A rank SIGKILLed inside ``elastic.run`` on a Spark barrier task: its task starts a new one
    on the same rows (the spilled shard kept for it), the other rank keeps its process, every
    step's global batch (by id) is one of the ranks' shards, each step once, and the model is what
    one process computes on those global batches."""
    import os

    import torch

    from tests.support import elastic_helpers as eh

    rng = np.random.default_rng(0)
    rows = [(i, *map(float, rng.normal(size=4))) for i in range(64)]
    features = {r[0]: r[1:] for r in rows}
    df = spark.createDataFrame(rows, "id long, x0 double, x1 double, x2 double, x3 double").repartition(3)
    lines = []
    runner = BarrierRunner(2, timeout=240, max_restarts=1, log_sink=lines.append)
    out = runner.run_with_data(df, eh.main, str(tmp_path), [(1, 5)], True)
    text = "".join(lines)
    seen = out["ranks"][0]["seen"]
    assert [s for s, _ in seen] == list(range(eh.STEPS))
    for rank in (0, 1):  # the rows of rank r at step s: its shard's, sorted by id, from s * 8 on
        shard = sorted({i for _, ids in seen for i in ids[rank]})
        assert len(shard) == 32, shard  # 64 rows, 2 ranks: 12 steps of 8 read the whole shard
        for step, ids in seen:
            assert ids[rank] == [shard[(step * 8 + j) % 32] for j in range(8)], (rank, step)
    for key, value in eh.one_process(2, features=features, seen=seen).items():
        assert torch.allclose(out["weights"][key], value, atol=1e-5), key
    starts = [n.rsplit("-", 1)[0] for n in os.listdir(tmp_path) if n.startswith("start-")]
    assert sorted(starts) == ["start-0", "start-1", "start-1"], starts  # rank 0 kept its process
    assert "rank 1 was killed by signal 9 (SIGKILL) inside elastic.run" in text
    assert "rank 1 rejoined at commit 5" in text and "fresh rendezvous" not in text
    assert_no_rank_left()
