"""The truth matrix: what trains on the ranks computes what one process computes on the same global
batches, for every backend, data path and world size (issue 51; docs/runner.md, "The same answer
as one process").

Each case runs real programs on the runner's ranks over the shards of one DataFrame (100 rows, 2
epochs; 1 and 2 ranks as Spark barrier tasks of local[2], 4 ranks as local processes, which is all
the pass's 2 slots allow) and checks two things of each program (tests/support/truth.py says how
each records what its train step saw):

(a) the ids each rank's *train step* saw: every row once per epoch (100 rows divide evenly over 1,
    2 and 4 ranks, so no row is given twice; the uneven case is tests/unit/test_streaming.py's);
(b) the weights equal one process (numpy, float64) trained from the same start on the same global
    batches: fp32 within 1e-5; fp16 compression within 2e-4 and PowerSGD (rank 1, after 2 plain
    steps) within 0.05, as docs/runner.md states; ``accumulate=2`` equals one process taking a
    step every 2 batches; DiLoCo with H=1 and a plain outer SGD equals DDP.

The matrix is factored where a product would only repeat itself: a data path decides which rows
reach which rank, and every backend reads them through the same ``shard()`` loader (``to_keras``
and ``to_tf_dataset`` are that loader), so every data path x world size runs under DDP, and every
backend x world size on the Parquet files read in place. Programs of one backend share a launch
(``truth.several``). The checker's own test rides in the 2-rank torch launch: an average that sums,
or that drops a rank's gradient, must fail it.
"""

import json

import pytest
from pyspark.sql import functions as F

from sparkml_dist.runner import BarrierRunner
from sparkml_dist.tensorflow_distributor import MirroredStrategyRunner
from tests.conftest import masters
from tests.support import truth

pytestmark = [masters("local"), pytest.mark.timeout(300)]

ROWS, EPOCHS, GLOBAL = 100, 2, 16  # 7 steps an epoch, the last one shorter (4 rows of 16)
FULL = 20  # a global batch that divides 100: for fixed shapes (pipelines) and accumulate=2
WORLDS = {1: 1, 2: 2, 4: -4}  # world size -> np: 4 ranks are local processes here (2 slots)
EXACT = 1e-5
TOLERANCE = {"fp16": 2e-4, "powersgd": 0.05, "servers fp16": 2e-4}  # what docs/runner.md states


@pytest.fixture(scope="module")
def table(spark, tmp_path_factory):
    pdf = truth.frame(ROWS)
    path = str(tmp_path_factory.mktemp("truth") / "rows")
    spark.createDataFrame(pdf).repartition(3).write.parquet(path)
    return pdf, path


def _data(spark, path, how):
    """The DataFrame and the runner's options of each data path."""
    df = spark.read.parquet(path)
    if how == "staged":  # a computed DataFrame: written once as Parquet, read in place
        return df.withColumn("y", F.col("y") * F.lit(1.0).cast("float")), {}
    if how == "exact":  # dealt through Spark in one shuffle, spilled to the ranks' disks
        return df, {"read_files": False}
    return df, {}  # "parquet" and "windows": the scan's own files


def _programs(world, rows, *, replicas=None, **loader):
    """(label, truth function, per-rank batch, options) of each program: ``rows`` is
    (label, function, global batch, options)."""
    data_ranks = replicas or world
    return [
        (label, fn, batch // data_ranks, dict(options, loader=loader) if loader else options)
        for label, fn, batch, options in rows
    ]


def _launch(spark, path, world, rows, *, how="parquet", backend="torch", replicas=None):
    """Every rank's results, by program label."""
    df, runner_options = _data(spark, path, how)
    loader = {"window_rows": 5, "read_ahead": 2} if how == "windows" else {}
    programs = _programs(world, rows, replicas=replicas, **loader)
    runner = BarrierRunner(WORLDS[world], backend=backend, timeout=240, log_ranks="none", **runner_options)
    per_rank = runner.run_with_data(df, truth.several, programs, EPOCHS, return_all=True, replicas=replicas)
    return {label: [r[label] for r in per_rank] for label, *_ in rows}


def _fault(pdf, results, tolerance=EXACT, accumulate=1):
    """What is wrong with one program's results, or None: (a) every row once an epoch in the
    train steps; (b) the weights of every rank that returns them within ``tolerance`` of one
    process on the same global batches."""
    steps = truth.global_steps(results)
    per_epoch = len(steps) // EPOCHS
    for e in range(EPOCHS):
        seen = sorted(i for s in steps[e * per_epoch : (e + 1) * per_epoch] for i in s)
        if seen != list(range(ROWS)):
            return f"epoch {e}: the train steps saw {len(seen)} rows, {len(set(seen))} of {ROWS} distinct"
    expected = truth.reference(pdf, steps, accumulate=accumulate)
    weights = [r["weights"] for r in results if r["weights"] is not None]
    diffs = [truth.difference(w, expected) for w in weights]
    if not diffs or max(diffs) >= tolerance:
        return f"weights {max(diffs or [float('nan')]):.2e} from one process on the same global batches"
    return None


def _assert_true(pdf, by_label, **accumulate):
    faults = {}
    for label, results in by_label.items():
        if label.startswith("mutated"):
            continue
        fault = _fault(pdf, results, TOLERANCE.get(label, EXACT), accumulate.get(label, 1))
        if fault:
            faults[label] = fault
    assert faults == {}


@pytest.mark.parametrize("world", sorted(WORLDS))
@pytest.mark.parametrize("how", ["staged", "exact", "windows"])
def test_every_data_path_trains_what_one_process_trains(spark, table, how, world):
    pdf, path = table
    out = _launch(spark, path, world, [("ddp", "torch_ddp", GLOBAL, {})], how=how)
    _assert_true(pdf, out)
    steps = truth.global_steps(out["ddp"])
    assert len(steps) == EPOCHS * 7 and len(steps[6]) == 4  # the last batch of an epoch: 4 rows


TORCH = [
    ("ddp", "torch_ddp", GLOBAL, {}),
    ("fsdp2", "torch_fsdp2", GLOBAL, {}),
    ("sparkml_dist.keras", "keras_torch", GLOBAL, {}),
]
COMM = [  # DDP's communication settings and DiLoCo, on 2 ranks
    ("fp16", "torch_ddp", GLOBAL, {"comm": {"compression": "fp16"}}),
    ("powersgd", "torch_ddp", GLOBAL, {"comm": {"compression": "powersgd", "powersgd_rank": 1,
                                                 "powersgd_start": 2}}),
    ("accumulate", "torch_ddp", FULL, {"comm": {"accumulate": 2}}),
    ("diloco", "torch_ddp", GLOBAL, {"diloco": {"sync_every": 1, "outer_lr": 1.0, "outer_momentum": 0.0,
                                                "nesterov": False}}),
    ("mutated: sum", "torch_ddp", GLOBAL, {"mutate": "sum"}),
    ("mutated: drop", "torch_ddp", GLOBAL, {"mutate": "drop"}),
]  # fmt: skip


@pytest.mark.parametrize("world", sorted(WORLDS))
def test_torch_ddp_fsdp2_and_keras_on_torch_train_what_one_process_trains(spark, table, world):
    """On 2 ranks also DDP's compression and accumulation, DiLoCo, and the checker's own test."""
    pdf, path = table
    out = _launch(spark, path, world, TORCH + (COMM if world == 2 else []))
    _assert_true(pdf, out, accumulate=2)
    if world == 2:  # a wrong average is caught, though every row was seen once
        for label in ("mutated: sum", "mutated: drop"):
            assert "from one process" in (_fault(pdf, out[label]) or ""), label
        assert _fault(pdf, out["fp16"]) is not None  # fp16 is not exact: the tolerance is needed


@pytest.mark.parametrize("world", sorted(WORLDS))
def test_pipeline_stages_train_what_one_process_trains(spark, table, world):
    pdf, path = table
    replicas = max(1, world // 2)  # two stages a replica (both on the one rank of a world of 1)
    out = _launch(spark, path, world, [("pipeline", "torch_pipeline", FULL, {})], replicas=replicas)
    _assert_true(pdf, out)


@pytest.mark.parametrize("world", sorted(WORLDS))
def test_horovod_trains_what_one_process_trains(spark, table, world):
    pdf, path = table
    out = _launch(spark, path, world, [("horovod", "horovod_torch", GLOBAL, {})], backend="horovod")
    _assert_true(pdf, out)


@pytest.mark.parametrize("world", sorted(WORLDS))
def test_tf_keras_under_the_strategy_trains_what_one_process_trains(spark, table, world):
    pdf, path = table
    out = _launch(spark, path, world, [("tf.keras", "tf_keras", GLOBAL, {})], backend="tensorflow")
    _assert_true(pdf, out)


@pytest.mark.parametrize("world", sorted(WORLDS))
def test_mirrored_strategy_runner_trains_what_one_process_trains(spark, table, world, tmp_path):
    """It returns its first worker's value: every worker also writes its results to a file (the
    ranks run on this machine)."""
    pdf, path = table
    df, _ = _data(spark, path, "parquet")
    programs = _programs(world, [("tf.keras", "tf_in_strategy_runner", GLOBAL, {"out": str(tmp_path)})])
    runner = MirroredStrategyRunner(num_slots=world, local_mode=world > 2, use_gpu=False, timeout=240)
    first = runner.run_with_data(df, truth.several, programs=programs, epochs=EPOCHS)
    per_rank = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert len(per_rank) == world and per_rank[0] == json.loads(json.dumps(first))
    _assert_true(pdf, {"MirroredStrategyRunner": [r["tf.keras"] for r in per_rank]})


@pytest.mark.parametrize("world", sorted(WORLDS))
def test_jax_and_keras_on_jax_train_what_one_process_trains(spark, table, world):
    pdf, path = table
    rows = [("jax", "plain_jax", GLOBAL, {}), ("keras-jax", "keras_jax", GLOBAL, {})]
    _assert_true(pdf, _launch(spark, path, world, rows, backend="jax"))


FP16 = {"comm": {"compression": "fp16"}}


@pytest.mark.parametrize("how", ["parquet", "exact"])
@pytest.mark.parametrize("world, servers", [(2, 1), (4, 2)])
def test_reduction_servers_train_what_one_process_trains(spark, table, how, world, servers):
    """DDP whose buckets the run's reduction servers sum (comm={"reduction_servers": k}), in float32
    and with fp16 shards: the rows dealt to the workers only, read in place or through Spark. Local
    processes: world + servers ranks are more than the pass's 2 slots."""
    pdf, path = table
    df, options = _data(spark, path, how)
    runner = BarrierRunner(
        -world, comm={"reduction_servers": servers}, timeout=240, log_ranks="none", **options
    )
    rows = [("servers", "torch_ddp", GLOBAL, {}), ("servers fp16", "torch_ddp", GLOBAL, FP16)]
    per_rank = runner.run_with_data(df, truth.several, _programs(world, rows), EPOCHS, return_all=True)
    assert len(per_rank) == world  # the workers' results: the servers run no function
    out = {label: [r[label] for r in per_rank] for label in ("servers", "servers fp16")}
    _assert_true(pdf, out)
    assert _fault(pdf, out["servers fp16"]) is not None  # half-precision shards: not exact
