"""Runner pieces without Spark: rendezvous maths, the log channel, shards, the task supervisor."""

import dataclasses
import hmac
import os
import pickle
import re
import socket
import struct
import threading
import time
from hashlib import sha256

import numpy as np
import pyarrow as pa
import pytest

from sparkml_dist import ConfigurationError, InsufficientResourcesError, WorkerError, gpus, serialization
from sparkml_dist.channel import LogClient, new_secret
from sparkml_dist.channel.server import LogServer
from sparkml_dist.runner import admission, protocol, rendezvous
from sparkml_dist.runner.data.shard import Shard
from sparkml_dist.runner.data.spec import SparkRows, Streams
from sparkml_dist.runner.deadlines import Deadline
from sparkml_dist.runner.settings import Logs, Timeouts
from sparkml_dist.runner.tasks import task as _task
from sparkml_dist.runner.tasks.gangs import ThreadGang

pytestmark = pytest.mark.slow  # starts rank processes or waits on timeouts: not in make test-fast


def test_local_ranks_and_env():
    assert rendezvous.local_ranks(["a", "b", "a", "a"]) == [(0, 3), (0, 1), (1, 3), (2, 3)]
    env = rendezvous.rank_env(2, ["a", "b", "a"], "a", 1234, gpus=[["5"], ["0"], ["3"]])
    assert env["RANK"] == "2" and env["WORLD_SIZE"] == "3" and env["LOCAL_RANK"] == "1"
    assert env["LOCAL_WORLD_SIZE"] == "2" and env["MASTER_PORT"] == "1234"
    assert env["CUDA_VISIBLE_DEVICES"] == "5,3" and env[rendezvous.AGENT_STORE_ENV] == "True"
    assert env["GROUP_RANK"] == env["NODE_RANK"] == "0" and env["GROUP_WORLD_SIZE"] == "2"
    assert "CUDA_VISIBLE_DEVICES" not in rendezvous.rank_env(0, ["a"], "a", 1)


class _Res:
    def __init__(self, addresses):
        self.addresses = addresses


def test_gpu_assignment_from_task_resources():
    assert gpus.task_gpus({"gpu": _Res(["1"])}, True, 0) == ["1"]
    assert gpus.task_gpus({}, False, 0) is None
    with pytest.raises(InsufficientResourcesError, match="assigned no GPU to the task of rank 1"):
        gpus.task_gpus({}, True, 1)


def _conf(d):
    return lambda k, default=None: d.get(k, default)


def test_slot_checks():
    admission.check_slots(2, "local[2]", _conf({}))
    with pytest.raises(
        InsufficientResourcesError, match=r"np=3 barrier tasks need 3 task slots but the cluster has 2"
    ):
        admission.check_slots(3, "local[2]", _conf({}))
    with pytest.raises(InsufficientResourcesError, match="has 2"):
        admission.check_slots(3, "local-cluster[2,1,1024]", _conf({}))
    with pytest.raises(InsufficientResourcesError, match=r"spark.dynamicAllocation.maxExecutors=1"):
        admission.check_slots(
            4,
            "yarn",
            _conf(
                {
                    "spark.dynamicAllocation.enabled": "true",
                    "spark.dynamicAllocation.maxExecutors": "1",
                    "spark.executor.cores": "2",
                }
            ),
            live_slots=8,
        )
    admission.check_slots(4, "yarn", _conf({}), live_slots=None)  # unknown: Spark's own check decides
    with pytest.raises(InsufficientResourcesError, match="will have 4 but only 1 are registered"):
        admission.check_slots(3, "local-cluster[2,2,1024]", _conf({}), live_slots=1)


def test_encryption_refused_unless_opted_in():
    assert admission.check_encryption(_conf({}), False) is None
    with pytest.raises(
        ConfigurationError, match=r"spark.network.crypto.enabled=true.*allow_unencrypted=True"
    ):
        admission.check_encryption(_conf({"spark.network.crypto.enabled": "true"}), False)
    warning = admission.check_encryption(_conf({"spark.ssl.enabled": "true"}), True)
    assert "not encrypted" in warning


def test_every_way_spark_encrypts_is_seen_tls_rpc_included():
    """Spark 4 encrypts its RPC with TLS through spark.ssl.rpc.enabled, which spark.ssl.enabled does
    not imply: a cluster set up that way alone is refused too."""
    for key in admission.ENCRYPTION_KEYS:
        with pytest.raises(ConfigurationError, match=re.escape(f"{key}=true")):
            admission.check_encryption(_conf({key: "true"}), False)
    assert "spark.ssl.rpc.enabled" in admission.ENCRYPTION_KEYS


# ------------------------------------------------------------------ channel
def _handshake(sock, secret):
    nonce = sock.recv(32)
    sock.sendall(hmac.new(secret, nonce, sha256).digest())


def _closed_by_server(sock) -> bool:
    sock.settimeout(10)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
            if len(data) == 32:  # the nonce sent before the bad answer was read
                continue
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_channel_accepts_only_the_secret_and_never_unpickles():
    got = []
    secret = new_secret()
    server = LogServer(secret, got.append, host="127.0.0.1")
    try:
        good = LogClient("127.0.0.1", server.port, secret)
        good.send({"type": "line", "rank": 0, "text": "before"})
        # 1. wrong secret
        bad = socket.create_connection(("127.0.0.1", server.port))
        _handshake(bad, b"not the secret")
        bad.sendall(struct.pack(">I", 2) + b"{}")
        # 2. no handshake: a pickle payload straight away
        evil = socket.create_connection(("127.0.0.1", server.port))
        evil.sendall(pickle.dumps({"type": "line", "rank": 9, "text": "pickled"}) * 3)
        # 3. right secret but a huge length prefix
        huge = socket.create_connection(("127.0.0.1", server.port))
        _handshake(huge, secret)
        huge.sendall(struct.pack(">I", 1 << 31))
        for s in (bad, evil, huge):
            assert _closed_by_server(s)
        deadline = time.time() + 10
        while server.rejected < 3 and time.time() < deadline:
            time.sleep(0.05)
        good.send({"type": "line", "rank": 0, "text": "after"})
        deadline = time.time() + 10
        while len(got) < 2 and time.time() < deadline:
            time.sleep(0.05)
        assert [m["text"] for m in got] == ["before", "after"]  # legitimate rank unaffected
        assert server.rejected == 3  # wrong secret, pickle instead of a handshake, huge frame
        for s in (bad, evil, huge):
            s.close()
        good.close()
    finally:
        server.close()


# ------------------------------------------------------------------ shards
def _shard(n, sizes, rank=0):
    table = pa.table(
        {
            "features": pa.array([[float(i), float(-i)] for i in range(n)], pa.list_(pa.float64())),
            "label": pa.array(np.arange(n) % 3, pa.int64()),
        }
    )
    return Shard(table, sizes, rank)


def test_shard_numpy_torch_and_equal_steps_on_uneven_shards():
    small, big = _shard(10, [10, 37], 0), _shard(37, [10, 37], 1)
    X = small.to_numpy(["features"])
    assert X.shape == (10, 2) and X[3, 1] == -3.0
    t = small.to_torch(["features"])
    assert str(t.dtype) == "torch.float32" and t.shape == (10, 2)
    t[0, 0] = 5.0  # writable, and does not alias the shard
    assert small.to_numpy(["features"])[0, 0] == 0.0
    # every row of the longer shard once (4 steps, the shorter one filled from its start), or
    # with drop_last only the steps both fill with rows not yet given
    for drop_last, expected in ((False, 4), (True, 1)):
        a = list(small.dataloader(10, ["features", "label"], drop_last=drop_last))
        b = list(big.dataloader(10, ["features", "label"], drop_last=drop_last))
        assert len(a) == len(b) == expected
        assert [len(x) for x, _ in a] == [len(x) for x, _ in b]  # the same batch sizes on both
    xb, yb = next(iter(big.dataloader(8, ["features", "label"])))
    assert xb.shape == (8, 2) and str(yb.dtype) == "torch.int64"
    loader = big.dataloader(37, ["label"], shuffle=True, seed=4)
    e0, e1 = next(iter(loader))[0], next(iter(loader))[0]
    assert sorted(e0.tolist()) == sorted(e1.tolist()) and e0.tolist() != e1.tolist()
    assert next(iter(big.dataloader(37, ["label"], shuffle=True, seed=4)))[0].tolist() == e0.tolist()
    with pytest.raises(ConfigurationError, match="empty shard"):
        _shard(0, [0, 5]).dataloader(4)


# ------------------------------------------------------------------ supervisor on a thread gang
def _spec(
    fn,
    *args,
    world=2,
    return_all=False,
    max_result=1 << 30,
    start_timeout=60.0,
    per_task=1,
    data_timeout=None,
    rows=2000,
):
    return _task.TaskSpec(
        timeouts=Timeouts(start=start_timeout, data=data_timeout, collective=60.0),
        ranks_per_task=per_task,
        run_id="t" + str(time.time_ns()),
        world_size=world,
        payload=serialization.dumps((fn, args, {}, True)),
        backend="torch",
        logs=Logs(ranks=()),
        channel=None,
        secret=b"s",
        data=SparkRows(Streams(tuple(rows for _ in range(world)), world))
        if data_timeout is not None
        else None,
        return_all=return_all,
        max_result_bytes=max_result,
    )


def _run_gang(spec, feed=lambda r: iter(())):
    tasks = spec.world_size // spec.ranks_per_task
    gang = ThreadGang(tasks, timeout=60)
    out, errors = {}, {}

    def go(r):
        try:
            out[r] = list(_task.supervise(gang.member(r), feed(r), spec))
        except Exception as exc:  # noqa: BLE001 - recorded for the assertions
            errors[r] = exc
            gang.member(r).abort()

    threads = [threading.Thread(target=go, args=(r,)) for r in range(tasks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out, errors


def test_a_task_of_several_ranks_runs_them_all_in_one_world():
    from sparkml_dist import collection
    from tests.support.runner_helpers import allreduce_rank_sum

    out, errors = _run_gang(_spec(allreduce_rank_sum, 1, world=4, per_task=2, return_all=True))
    assert not errors
    res = collection.decode(pa.Table.from_batches(out[0] + out[1]), range(4), what="rank")
    assert [res[(r, 0)]["sum"] for r in range(4)] == [10.0] * 4  # ranks 1+2+3+4, all in one world
    assert [res[(r, 0)]["env"]["RANK"] for r in range(4)] == ["0", "1", "2", "3"]
    assert {res[(r, 0)]["env"]["LOCAL_WORLD_SIZE"] for r in range(4)} == {"4"}  # one host


def test_a_failing_rank_stops_its_sibling_and_is_the_tasks_failure():
    from tests.support.runner_checks import assert_no_rank_left
    from tests.support.runner_helpers import fail_on

    started = time.monotonic()
    out, errors = _run_gang(_spec(fail_on, 1, "raise", world=2, per_task=2))
    assert time.monotonic() - started < 60
    detail = protocol.parse_failure(str(errors[0]))
    assert detail["rank"] == 1 and "injected failure" in "\n".join(detail["tail"])  # not rank 0's stop
    assert_no_rank_left()


def test_supervisor_runs_ranks_and_returns_rank0_result():
    from tests.support.runner_helpers import allreduce_rank_sum

    out, errors = _run_gang(_spec(allreduce_rank_sum, 4))
    assert not errors
    table = pa.Table.from_batches(out[0] + out[1])
    from sparkml_dist import collection

    res = collection.decode(table, [0], what="rank")
    assert res[(0, 0)]["sum"] == 3.0 and res[(0, 0)]["x"] == 4
    assert out[1] == []  # only rank 0 returns unless return_all


def test_result_larger_than_max_result_size_is_refused_with_a_pointer_to_storage():
    from tests.support.runner_helpers import big_result

    out, errors = _run_gang(_spec(big_result, 5000, world=1, max_result=1000))
    assert isinstance(errors[0], protocol.RankFailure)
    assert "more than the driver accepts" in str(errors[0]) and "ModelStore" in str(errors[0])
    assert protocol.parse_failure(str(errors[0]))["rank"] == 0


def test_return_all_results_must_fit_max_result_size_together():
    from sparkml_dist.runner import launchers
    from sparkml_dist.runner.failures import Monitor as _Monitor
    from tests.support.runner_helpers import big_result

    # each rank's 700-byte result fits the 1000-byte limit; the two together do not: the local
    # launcher checks the total as Spark's driver does (tests/spark/test_runner.py)
    spec = _spec(big_result, 700, world=2, max_result=1000, return_all=True)
    with pytest.raises(WorkerError) as caught:
        launchers.launch_local(None, spec, _Monitor(2, lambda s: None), Deadline.after(120))
    message = str(caught.value)
    assert "2 ranks' results total" in message and "maxResultSize" in message and "ModelStore" in message
    spec = _spec(big_result, 300, world=2, max_result=1000, return_all=True)
    table = launchers.launch_local(None, spec, _Monitor(2, lambda s: None), Deadline.after(120))
    from sparkml_dist import collection

    results = collection.decode(table, [0, 1], what="rank")
    assert results[(0, 0)] == results[(1, 0)] == b"x" * 300


def test_ranks_on_the_driver_name_the_root_cause_whichever_thread_ended_first():
    """np < 0: each rank's thread appends its failure; the peer that only lost its collective may
    end first, before any report reached the driver's channel: the rank that failed by itself is
    still the one named."""
    from sparkml_dist.runner import launchers
    from sparkml_dist.runner.failures import Monitor as _Monitor

    def failure(rank, code, tail):
        detail = dict(rank=rank, exit_code=code, phase="run", message=f"rank {rank} exited with code {code}")
        return protocol.RankFailure({**detail, "tail": tail, "failed_at": 1.0 + rank})

    peer = failure(0, 1, ["RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:62125"])
    own = failure(1, 7, ["rank 1 about to fail with exit"])
    done = threading.Event()
    done.set()
    with pytest.raises(WorkerError, match="rank 1 exited with code 7") as info:
        launchers.wait(done, _Monitor(2, lambda s: None), lambda: None, [peer, own], Deadline.after(60))
    assert info.value.rank == 1 and info.value.exit_code == 7


def test_ranks_on_the_driver_name_the_root_cause_the_log_channel_was_too_slow_to_bring():
    """np < 0 under a flooded log channel: only the peer's 'connection closed' report came through
    within the grace (5 s while only symptoms are in); the rank that raised is in its thread's error,
    and is the one named (seen once in a full local pass)."""
    from sparkml_dist.runner import launchers
    from sparkml_dist.runner.failures import Monitor as _Monitor

    peer = dict(rank=0, exit_code=1, phase="run", message="rank 0 exited with code 1", failed_at=1.0)
    peer["tail"] = ["RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:62125"]
    own = dict(rank=1, exit_code=1, phase="run", message="rank 1 exited with code 1", failed_at=2.0)
    own["tail"] = ["ValueError: injected failure"]
    monitor = _Monitor(2, lambda s: None)
    monitor.add_failure(peer)  # through the channel; rank 1's report never came
    errors = []
    done = threading.Event()

    def threads_end():  # after the driver saw the report: the job is cancelled, the threads end
        errors.extend([protocol.RankFailure(peer), protocol.RankFailure(own)])
        done.set()

    threading.Timer(0.5, threads_end).start()
    with pytest.raises(WorkerError, match="rank 1 exited with code 1") as info:
        launchers.wait(done, monitor, lambda: None, errors, Deadline.after(60))
    assert info.value.rank == 1 and "injected failure" in str(info.value)


def test_a_store_client_whose_store_went_away_is_a_symptom_of_the_rank_that_failed():
    """A reduction server forming its group when the workers' function raised: its store went
    away with rank 0, and its error came in first (seen in CI); the workers' error is the cause."""
    from sparkml_dist.runner.backends.base import COMMON_PEER_LOST
    from sparkml_dist.runner.protocol import root_cause

    store_gone = (
        "torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely "
        "closed. Did the remote server shutdown or crash?"
    )
    failures = [
        {"rank": 2, "failed_at": 1.0, "tail": ["  File reducers.py, line 77, in group", store_gone]},
        {"rank": 0, "failed_at": 1.2, "tail": ["ValueError: elastic.run does not form the group again"]},
    ]
    assert root_cause(failures, COMMON_PEER_LOST)["rank"] == 0


def test_root_cause_is_the_failure_not_its_symptoms():
    from sparkml_dist.runner.failures import Monitor as _Monitor

    m = _Monitor(3, lambda s: None)
    m.add_failure(
        {
            "rank": 0,
            "message": "rank 0 exited with code 1",
            "exit_code": 1,
            "failed_at": 1.0,
            "tail": ["RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:41856"],
        }
    )
    m.add_failure(
        {
            "rank": 2,
            "message": "rank 2 was stopped because the run was cancelled",
            "phase": "cancelled",
            "failed_at": 0.5,
            "tail": [],
        }
    )
    m.add_failure(
        {
            "rank": 1,
            "message": "rank 1 exited with code 7",
            "exit_code": 7,
            "failed_at": 2.0,
            "tail": ["about to fail"],
        }
    )
    err = m.worker_error()
    assert err.rank == 1 and err.exit_code == 7
    assert str(err).startswith("rank 1 exited with code 7; then rank 0 (exited with code 1)")


def test_a_working_directory_shared_by_many_tasks_is_one_line_and_a_count():
    from sparkml_dist.runner.failures import Monitor as _Monitor

    shown = []
    m = _Monitor(40, shown.append)
    for rank in range(40):  # one line per task: 40 hosts, the same path on 39 of them
        path = "/scratch/job" if rank == 7 else "/tmp/sparkml_dist-work-0/job"
        text = f"{protocol.WORKDIR_MARK}host{rank}: {path} (kept after the run)"
        m.on_message({"type": protocol.FRAME_LINE, "rank": rank, "stream": "log", "text": text})
    m.on_message({"type": protocol.FRAME_LINE, "rank": 3, "stream": "stdout", "text": "epoch 1"})
    assert [ln for ln in shown if "working directory" in ln] == [
        "[rank 0] working directory on host0: /tmp/sparkml_dist-work-0/job (kept after the run)\n",
        "[rank 7] working directory on host7: /scratch/job (kept after the run)\n",
    ]
    m.end(ok=True)
    assert shown[-1] == (
        "sparkml_dist: the same working directory on 38 more task(s) (host1, host2, host3, host4, "
        "host5, ...): /tmp/sparkml_dist-work-0/job (kept after the run)\n"
    )
    assert len(shown) == 4 and "[rank 3] epoch 1\n" in shown


def test_multi_chunk_shards_convert_across_chunk_boundaries():
    b1 = pa.record_batch(
        {"a": pa.array([1.0, 2.0]), "v": pa.array([[1.0, 2.0], [3.0, 4.0]]), "y": pa.array([0, 1])}
    )
    b2 = pa.record_batch({"a": pa.array([3.0]), "v": pa.array([[5.0, 6.0]]), "y": pa.array([2])})
    s = Shard(pa.Table.from_batches([b1, b2]), [3], 0)
    assert s.to_numpy(["a", "v"]).tolist() == [[1, 1, 2], [2, 3, 4], [3, 5, 6]]
    assert s.to_torch(["v", "a"]).tolist() == [[1, 2, 1], [3, 4, 2], [5, 6, 3]]
    ((v, y),) = list(s.dataloader(3, ["v", "y"], shuffle=False))
    assert v.tolist() == [[1, 2], [3, 4], [5, 6]] and y.tolist() == [0, 1, 2]
    ragged = pa.Table.from_batches(
        [pa.record_batch({"v": pa.array([[1.0]])}), pa.record_batch({"v": pa.array([[1.0, 2.0]])})]
    )
    with pytest.raises(ConfigurationError, match="different lengths"):
        Shard(ragged, [2], 0).to_numpy(["v"])


def test_local_ranks_of_tasks_holding_several_gpus_on_mixed_hosts():
    # host a runs two tasks of two GPUs, host b one: every rank's LOCAL_RANK / LOCAL_WORLD_SIZE
    def task(host, port=0):  # one task's exchange message: its two ranks, one GPU each
        ranks = [protocol.announce(host, port if j == 0 else 0, 10, [str(j)]) for j in range(2)]
        return "[" + ",".join(ranks) + "]"

    peers = protocol.peers([task("10.0.0.1", 29500), task("10.0.0.1"), task("10.0.0.2")])
    hosts = [p["host"] for p in peers]
    envs = [
        rendezvous.rank_env(r, hosts, peers[0]["host"], peers[0]["port"], [p["gpus"] for p in peers])
        for r in range(6)
    ]
    assert [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs] == [
        ("0", "4"),
        ("1", "4"),
        ("2", "4"),
        ("3", "4"),
        ("0", "2"),
        ("1", "2"),
    ]
    # host a's tasks report the same addresses (a naive discovery script): each rank sees its own;
    # host b's are distinct: torchrun's rule, LOCAL_RANK indexes the host's list
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "0", "1", "0,1", "0,1"]
    assert [e["SPARKML_DIST_CUDA_DEVICE"] for e in envs] == ["0", "0", "0", "0", "0", "1"]
    assert [e["GROUP_RANK"] for e in envs] == ["0", "0", "0", "0", "1", "1"] == [e["NODE_RANK"] for e in envs]
    tasks = rendezvous.node_keys(hosts, "task", 2)  # pyspark's rule: each task a node
    by_task = [rendezvous.rank_env(r, tasks, hosts[0], 1, [p["gpus"] for p in peers]) for r in range(6)]
    assert [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"]) for e in by_task] == [
        ("0", "2", "0"),
        ("1", "2", "0"),
        ("0", "2", "1"),
        ("1", "2", "1"),
        ("0", "2", "2"),
        ("1", "2", "2"),
    ]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in by_task] == ["0,1"] * 6  # a task's GPUs, LOCAL_RANK picks
    assert {e["MASTER_PORT"] for e in envs} == {"29500"} and {e["WORLD_SIZE"] for e in envs} == {"6"}


def _trickle(batches, gap_s, stall_after=None, stall_s=0.0, stream=0):
    """Batches of 100 rows of stream ``stream`` arriving every ``gap_s`` seconds; after
    ``stall_after`` batches, none for ``stall_s``."""
    from sparkml_dist.group_rows import GROUP_COL

    for i in range(batches):
        if i == stall_after:
            time.sleep(stall_s)
        time.sleep(gap_s)
        yield pa.record_batch(
            {"x": pa.array([float(i)] * 100), GROUP_COL: pa.array([stream] * 100, pa.int32())}
        )


def test_a_shard_that_keeps_arriving_is_never_cut_off_by_the_data_or_start_timeout():
    from sparkml_dist import collection
    from tests.support.runner_helpers import shard_summary

    # 5 s of data per rank, start_timeout 2 s, data_timeout 1 s: the rendezvous deadline starts
    # when the shard is written, and a batch every 0.25 s is progress
    spec = _spec(shard_summary, 10, world=2, data_timeout=1.0, start_timeout=2.0, return_all=True)
    started = time.monotonic()
    out, errors = _run_gang(spec, feed=lambda r: _trickle(20, 0.25, stream=r))
    assert not errors and time.monotonic() - started > 5.0
    res = collection.decode(pa.Table.from_batches(out[0] + out[1]), range(2), what="rank")
    assert [res[(r, 0)]["rows"] for r in range(2)] == [2000, 2000]


def test_a_stalled_shard_fails_naming_its_rank_and_the_data_timeout():
    from tests.support.runner_checks import assert_no_rank_left
    from tests.support.runner_helpers import shard_summary

    spec = _spec(shard_summary, 10, world=1, data_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(protocol.RankFailure) as err:
        list(_task.supervise(ThreadGang(1).member(0), _trickle(4, 0.05, stall_after=2, stall_s=2.5), spec))
    detail = protocol.parse_failure(str(err.value))
    assert detail["phase"] == "data" and detail["rank"] == 0
    assert "shard of rank 0 stalled: no rows arrived from Spark for 1s after 200 rows" in detail["message"]
    assert "data_timeout=1.0s" in detail["message"] and time.monotonic() - started < 10
    assert_no_rank_left()


def test_a_rank_dead_before_its_start_message_is_reported_with_its_own_exit_code(monkeypatch):
    import os

    here = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support", "dies_at_start")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    from tests.support.runner_helpers import allreduce_rank_sum

    spec = dataclasses.replace(_spec(allreduce_rank_sum), warm_ranks=False)  # the injection: at its start
    task = _task._RankTask(ThreadGang(2).member(1), spec, None)
    try:
        task.start()
        end = time.monotonic() + 60
        while not any("cannot start: injected" in ln for ln in task.process.lines()):  # stdin closed
            assert time.monotonic() < end
            time.sleep(0.05)
        with pytest.raises(protocol.RankFailure) as err:
            task.send_start(b"{}\n")
    finally:
        task.cleanup()
    detail = protocol.parse_failure(str(err.value))
    assert detail["message"] == "rank 1 exited with code 7 before it started" and detail["exit_code"] == 7
    assert any("cannot start: injected" in ln for ln in detail["tail"])


def test_a_read_still_blocked_after_the_stall_report_ends_the_task(monkeypatch):
    """When the driver never cancels (its channel is gone), the blocked task is ended by on_stuck
    (in a Spark task: its Python worker) instead of waiting forever."""
    import threading

    from sparkml_dist.runner.data import feeding

    monkeypatch.setattr(feeding, "STUCK_GRACE", 0.5)
    release, stuck = threading.Event(), []

    def forever():
        yield pa.record_batch({"x": pa.array([1.0])})
        release.wait(30)  # a shuffle fetch from a lost executor

    watch = feeding.DataWatch(0.5, lambda idle, rows: RuntimeError(f"stalled after {rows}"), stuck.append)
    reader = threading.Thread(target=lambda: [None for _ in watch.batches(forever())])
    started = time.monotonic()
    with watch:
        reader.start()
        deadline = time.monotonic() + 10
        while not stuck and time.monotonic() < deadline:
            time.sleep(0.05)
        release.set()
        reader.join()
    assert [str(e) for e in stuck] == ["stalled after 1"] and time.monotonic() - started < 5
    fine = feeding.DataWatch(0.5, lambda idle, rows: RuntimeError("x"), stuck.append)
    with fine:
        list(fine.batches(iter([pa.record_batch({"x": pa.array([1.0])})])))
    assert len(stuck) == 1  # a read that keeps moving is never ended


def test_a_root_cause_reported_late_is_still_waited_for_while_only_symptoms_are_in():
    """A rank that raised may take a while to exit (atexit handlers, a loaded machine) while its
    peer reports 'Connection closed by peer' at once: the driver must not blame the peer."""
    from sparkml_dist.runner.failures import Monitor as _Monitor

    m = _Monitor(2, lambda s: None)
    peer = {"rank": 1, "message": "rank 1 exited with code 1", "exit_code": 1, "failed_at": 1.0}
    m.add_failure(
        {**peer, "tail": ["RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:7605"]}
    )
    cause = {"rank": 0, "message": "rank 0 exited with code 1", "exit_code": 1, "failed_at": 2.0}
    late = threading.Timer(2.0, m.add_failure, ({**cause, "tail": ["ValueError: injected failure"]},))
    late.start()
    t = time.monotonic()
    m.wait_for_reports(grace=0.5, symptom_grace=10.0)
    assert 1.5 < time.monotonic() - t < 8
    err = m.worker_error()
    assert err.rank == 0 and str(err).startswith("rank 0 exited with code 1; then rank 1")
    m = _Monitor(3, lambda s: None)  # a real cause in: only the short grace for the others
    m.add_failure({**cause, "tail": ["ValueError: injected failure"]})
    t = time.monotonic()
    m.wait_for_reports(grace=0.3, symptom_grace=10.0)
    assert time.monotonic() - t < 2


def test_a_full_disk_while_spilling_reaches_the_driver_with_its_cause(tmp_path):
    """The shard is spilled to a 1 MiB tmpfs (a full local disk): the rank fails with the OSError
    and what to do in its message, which the driver's error carries (not Spark's getResult)."""
    import subprocess
    import types

    import pyarrow as pa

    from sparkml_dist.group_rows import GROUP_COL
    from sparkml_dist.runner import protocol
    from sparkml_dist.runner.data import feeding
    from sparkml_dist.runner.data.spec import SparkRows, Streams

    disk = tmp_path / "small"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True)
    try:
        failed = []

        class Member:
            rank, address, gang = 0, "127.0.0.1", types.SimpleNamespace(echo_output=False)
            workdir = str(disk / "rank0")
            spec = types.SimpleNamespace(
                data=SparkRows(Streams((200_000,), 1)), timeouts=Timeouts(data=None), payload=b""
            )

            def fail(self, message, code=None, phase="run"):
                failed.append(phase)
                return protocol.RankFailure({"rank": 0, "message": message, "phase": phase})

        os.mkdir(Member.workdir)
        rows = pa.record_batch(
            [pa.array(np.zeros(50_000, np.int32)), pa.array(np.random.default_rng(0).normal(size=50_000))],
            names=[GROUP_COL, "x"],
        )
        with pytest.raises(protocol.RankFailure) as err:
            feeding.feed([Member()], [rows] * 4)
        detail = protocol.parse_failure(str(err.value))
        assert failed == ["data"] and detail["phase"] == "data"
        assert "OSError: [Errno 28]" in detail["message"] and "No space left on device" in detail["message"]
        assert (
            "the executor's local disk is full" in detail["message"]
            and "spark.local.dir" in detail["message"]
        )
        assert os.listdir(Member.workdir) == ["shard.arrow"]  # closed: the disk can be unmounted
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_the_torch_distributor_drop_in_names_num_processes_not_np():
    from sparkml_dist import InsufficientResourcesError
    from sparkml_dist.distributor import TorchDistributor

    with pytest.raises(InsufficientResourcesError, match=r"Lower num_processes") as err:
        TorchDistributor(num_processes=2, local_mode=True, use_gpu=True).run(print)
    assert not re.search(r"\bnp\b", str(err.value))


def test_a_traceback_a_rank_prints_is_held_shown_if_the_rank_goes_on_dropped_if_the_run_fails():
    from sparkml_dist.runner import failures, protocol

    shown = []
    m = failures.Monitor(2, shown.append)
    tb = ["Traceback (most recent call last):", '  File "x.py", line 1, in f', "ValueError: handled"]
    for text in tb:
        m.on_message({"type": protocol.FRAME_LINE, "rank": 0, "stream": "stderr", "text": text})
    assert shown == []  # held
    m.on_message({"type": protocol.FRAME_LINE, "rank": 0, "stream": "stdout", "text": "step 5"})
    assert shown == [f"[rank 0] {t}\n" for t in tb + ["step 5"]]  # the rank went on: it was handled
    shown.clear()
    for text in tb:
        m.on_message({"type": protocol.FRAME_LINE, "rank": 1, "stream": "stderr", "text": text})
    m.end(ok=False)
    assert shown == []  # the run failed: the error carries the root cause's traceback instead
    for text in tb:
        m.on_message({"type": protocol.FRAME_LINE, "rank": 1, "stream": "stderr", "text": text})
    m.end(ok=True)
    assert len(shown) == 3


def test_the_stuck_line_names_the_ranks_in_the_collective_and_each_one_missing():
    import json

    import torch.distributed as dist

    from sparkml_dist.runner.tasks import stall_watch

    store = dist.HashStore()  # the rendezvous store's interface, in memory
    world = 12
    for r in (1, 2):  # in the same all_reduce as rank 0
        store.set(
            f"{stall_watch.STATUS_KEY}{r}", json.dumps({"seq": 5, "op": "all_reduce", "where": "t.py:9"})
        )
    store.set(f"{stall_watch.STATUS_KEY}3", json.dumps({"seq": 4, "op": "", "where": "t.py:7 in load"}))
    store.set(f"{stall_watch.STATUS_KEY}4", json.dumps({"seq": 6, "op": "barrier", "where": "t.py:12"}))
    store.set(f"{stall_watch.STATUS_KEY}5", b"\x80not json")  # unreadable: that rank has no status
    mine = {"seq": 5, "op": "all_reduce", "where": "t.py:9 in step"}
    line = stall_watch.stuck_line(stall_watch.Group(store, 0, world, 5), mine, 61.2)
    assert line.startswith("all_reduce #5 has waited 61 s: ranks 0-2 in it; not in it: ")
    assert "rank 3 (after collective #4, at t.py:7 in load)" in line
    assert "rank 4 (in barrier #6, at t.py:12)" in line and "rank 5 (no status yet)" in line
    assert line.endswith("rank 10 (no status yet) and 1 more")  # 9 missing: 8 named, 1 counted
    assert (
        stall_watch.stuck_line(stall_watch.Group(store, 2, world, 5), {**mine}, 61.2) is None
    )  # rank 0 says it
    assert stall_watch.ranks([7]) == "rank 7" and stall_watch.ranks([0, 1, 2, 5, 7, 8]) == "ranks 0-2, 5, 7-8"


def test_a_vector_columns_width_is_read_from_what_spark_ml_declares():
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import StructField

    from sparkml_dist.runner.data.sharding import declared_width

    def field(metadata):
        return StructField("f", VectorUDT(), metadata=metadata)

    assert declared_width(field({"ml_attr": {"num_attrs": 51}})) == 51  # VectorAssembler, HashingTF
    for absent in ({}, {"ml_attr": {}}, {"ml_attr": {"num_attrs": "51"}}, {"ml_attr": {"num_attrs": -1}}):
        assert declared_width(field(absent)) is None  # then the first rows say
    assert declared_width(field({"ml_attr": {"num_attrs": True}})) is None


# ------------------------------------------------------------------ the exchange through the driver
class _NoAllGather:
    """A thread gang's member whose allGather must not be used (the driver exchanges instead)."""

    def __init__(self, member) -> None:
        self._m, self.rank, self.echo_output = member, member.rank, False

    def allgather(self, message):
        raise AssertionError("the tasks used the gang's allGather, not the driver")

    def resources(self):
        return {}

    def pool_anchor(self):
        return os.getpid()

    def task_id(self):
        return None  # no Spark task: nothing for the driver to map to an executor


def _driver_exchange_run(spec, tasks):
    out, errors = {}, {}

    def go(r):
        try:
            out[r] = list(_task.supervise(_NoAllGather(ThreadGang(tasks).member(r)), iter(()), spec))
        except Exception as exc:  # noqa: BLE001 - recorded for the assertions
            errors[r] = exc

    threads = [threading.Thread(target=go, args=(r,)) for r in range(tasks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out, errors


def test_tasks_exchange_addresses_through_the_drivers_channel_without_the_gang():
    import dataclasses

    from sparkml_dist import collection
    from sparkml_dist.channel import new_secret
    from sparkml_dist.channel.server import listen
    from sparkml_dist.runner import failures
    from tests.support.runner_helpers import allreduce_rank_sum

    secret = new_secret()
    monitor = failures.Monitor(4, lambda text: None, tasks=2)
    server = listen(secret, monitor.on_message, "127.0.0.1", replies=True, expected=4)
    try:
        spec = dataclasses.replace(
            _spec(allreduce_rank_sum, 1, world=4, per_task=2, return_all=True),
            channel=("127.0.0.1", server.port), secret=secret, exchange="driver",
        )  # fmt: skip
        out, errors = _driver_exchange_run(spec, tasks=2)
    finally:
        server.close()
    assert not errors, errors
    res = collection.decode(pa.Table.from_batches(out[0] + out[1]), range(4), what="rank")
    assert [res[(r, 0)]["sum"] for r in range(4)] == [10.0] * 4  # one world of 4 from 2 tasks


def test_tasks_that_cannot_reach_the_driver_they_should_exchange_through_use_the_gang():
    # the network changed since the run that showed every task reaching the driver: no live logs
    # then, and the gang's allGather, as a run that never reached it has
    import dataclasses

    from sparkml_dist import collection
    from tests.support.runner_helpers import allreduce_rank_sum

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = dataclasses.replace(
        _spec(allreduce_rank_sum, 1, world=2, return_all=True), channel=("127.0.0.1", port), exchange="driver"
    )
    out, errors = _run_gang(spec)
    assert not errors, errors
    res = collection.decode(pa.Table.from_batches(out[0] + out[1]), range(2), what="rank")
    assert [res[(r, 0)]["sum"] for r in range(2)] == [3.0, 3.0]


def test_when_not_every_task_announces_in_time_the_driver_tells_every_task_to_use_the_gang():
    from sparkml_dist.runner.peer_exchange import Announces

    got = {0: [], 1: []}
    a = Announces(tasks=2, fallback_s=0.2)
    a.add({"task": 0, "ranks": "[0]"}, got[0].append)  # task 1 could not reach the driver
    time.sleep(0.6)
    assert got[0] == [{"type": protocol.FRAME_PEERS, "fallback": True}]
    a.add({"task": 1, "ranks": "[1]"}, got[1].append)  # a late one joins the gang too
    assert got[1] == [{"type": protocol.FRAME_PEERS, "fallback": True}]


def test_the_driver_answers_every_task_once_all_announced_and_ignores_the_malformed():
    from sparkml_dist.runner.peer_exchange import Announces

    got = {0: [], 1: []}
    a = Announces(tasks=2)
    for junk in ({"task": 2, "ranks": "[]"}, {"task": "0", "ranks": "[]"}, {"task": 0, "ranks": 5}):
        a.add(junk, got[0].append)
    a.add({"task": 1, "ranks": "[1]"}, got[1].append)
    assert got == {0: [], 1: []}  # one of two announced: nobody answered yet
    a.add({"task": 0, "ranks": "[0]"}, got[0].append)
    assert got[0] == got[1] == [{"type": protocol.FRAME_PEERS, "tasks": ["[0]", "[1]"]}]
