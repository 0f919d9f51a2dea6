"""``elastic.run``: a rank killed mid-run is replaced in place while the others keep running, and the
run ends with what one process computes on the same global batches (ranks as local processes,
np < 0; the Spark path with a shard of rows is in tests/spark/test_runner.py)."""

import os

import pytest
import torch

from sparkml_dist import ConfigurationError
from sparkml_dist.runner import BarrierRunner, elastic
from sparkml_dist.runner.elastic import state as state_mod
from tests.support import elastic_helpers as eh
from tests.support.runner_checks import assert_no_rank_left

pytestmark = pytest.mark.slow  # starts rank processes: not in make test-fast

TOL = 1e-6  # gloo's sum of 3 ranks' gradients against one process's mean over the joined batch


def _starts(marks, kind="start"):
    """{rank: [process ids that started it]} from the start marks (``ahead``: spares' only)."""
    out = {}
    for name in os.listdir(marks):
        if name.startswith(kind + "-"):
            _, rank, pid = name.split("-")
            out.setdefault(int(rank), []).append(int(pid))
    return out


def _run(tmp_path, kills, max_restarts, np_=-3, settle=0.0):
    lines = []
    runner = BarrierRunner(np_, timeout=180, max_restarts=max_restarts, log_sink=lines.append)
    out = runner.run(eh.main, str(tmp_path), kills, settle=settle)
    return out, lines


def test_a_rank_killed_twice_is_replaced_in_place_and_the_run_equals_one_process(tmp_path):
    """Each kill comes 2 s after its step begins: time for the task's spare to exist, which takes
    the lost rank's place with the optimizer's imports made (its ``ahead`` mark)."""
    out, lines = _run(tmp_path, [(1, 4), (2, 8)], max_restarts=2, settle=2.0)
    text = "".join(lines)
    reference = eh.one_process(3)
    for name, value in reference.items():
        assert torch.allclose(out["weights"][name], value, atol=TOL), (name, out["weights"][name], value)
    # the rows each committed step trained on, by id, on every rank: each step once, none twice
    for got in out["ranks"]:
        assert got["seen"] == [[s, eh.global_ids(s, 3)] for s in range(eh.STEPS)]
    starts = _starts(tmp_path)
    assert len(starts[0]) == 1 and len(starts[1]) == 2 and len(starts[2]) == 2, starts  # survivors kept
    assert out["ranks"][0]["pid"] == starts[0][0]
    # the replacements (the last process of ranks 1 and 2) were spares; the first ranks were not
    ahead = _starts(tmp_path, "ahead")
    assert ahead == {1: [out["ranks"][1]["pid"]], 2: [out["ranks"][2]["pid"]]}, (ahead, starts)
    assert "rank 1 was killed by signal 9 (SIGKILL) inside elastic.run" in text
    assert "rank 1 rejoined at commit 4 {'step': 4" in text and "rank 2 rejoined at commit 8" in text
    assert "fresh rendezvous" not in text  # no restart of the run
    assert_no_rank_left()


def test_without_restarts_left_the_lost_rank_fails_the_run_as_before(tmp_path):
    from sparkml_dist import WorkerError

    with pytest.raises(WorkerError, match="rank 1 was killed by signal 9"):
        _run(tmp_path, [(1, 3)], max_restarts=0, np_=-2)
    assert len(_starts(tmp_path)[1]) == 1  # not replaced
    assert_no_rank_left()


def test_a_lost_rank_0_is_replaced_too_and_serves_the_store_again(tmp_path):
    """Rank 0's process serves the run's store: its task keeps the socket, the new rank 0 serves a
    new store there and the survivor reconnects, keeping its process."""
    out, lines = _run(tmp_path, [(0, 5)], max_restarts=1, np_=-2)
    text = "".join(lines)
    assert "rank 0 was killed by signal 9 (SIGKILL) inside elastic.run: a new rank 0" in text
    assert "rank 0 rejoined at commit 5 {'step': 5" in text and "its state from rank 1" in text
    assert "fresh rendezvous" not in text
    for name, value in eh.one_process(2).items():
        assert torch.allclose(out["weights"][name], value, atol=TOL), name
    for got in out["ranks"]:
        assert got["seen"] == [[s, eh.global_ids(s, 2)] for s in range(eh.STEPS)]
    starts = _starts(tmp_path)
    assert len(starts[0]) == 2 and len(starts[1]) == 1, starts  # the survivor kept its process
    assert out["ranks"][1]["pid"] == starts[1][0]


def test_a_rank_lost_after_the_last_step_is_replaced_by_one_that_ends_once_the_others_return(tmp_path):
    """Rank 1 dies after the last step's collective, still inside elastic.run, and its task starts
    a new rank 1, which waits for a group the others will never form again: when rank 0's function
    returns, the new rank sees the training is over and ends, and the run returns rank 0's result
    (before, it waited collective_timeout and failed the run although every step was trained)."""
    lines = []
    runner = BarrierRunner(-2, timeout=180, max_restarts=1, log_sink=lines.append)
    out = runner.run(eh.lost_after_the_last_step, str(tmp_path))
    text = "".join(lines)
    assert out["steps"] == eh.STEPS
    for name, value in eh.one_process(2).items():
        assert torch.allclose(out["weights"][name], value, atol=TOL), name
    assert "rank 1 was killed by signal 9 (SIGKILL) inside elastic.run: a new rank 1" in text, text
    assert "rank 1 ends without training: the other ranks finished the training before it joined" in text
    starts = _starts(tmp_path)
    assert len(starts[0]) == 1 and len(starts[1]) == 2, starts
    assert "fresh rendezvous" not in text and "failed" not in text
    assert_no_rank_left()


def test_a_state_crosses_as_json_and_tensors_with_its_key_types(tmp_path):
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        sent = {"model": model.state_dict(), "optimizer": opt.state_dict(), "n": [1, 2.5, None, "a"]}
        got = state_mod.broadcast(sent, 0, "cpu")
        assert set(got["optimizer"]["state"]) == {0, 1}  # int keys stay ints
        assert torch.equal(got["optimizer"]["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
        assert got["n"] == [1, 2.5, None, "a"]
        fresh = torch.optim.Adam(torch.nn.Linear(3, 2).parameters(), lr=0.5)
        fresh.load_state_dict(got["optimizer"])  # what a new rank does with it
        assert fresh.param_groups[0]["lr"] == 0.01
    finally:
        dist.destroy_process_group()


def test_a_state_refuses_what_it_cannot_send_when_made():
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ConfigurationError, match=r"counter 'when' is a object"):
        elastic.TorchState(model=model, when=object())
    with pytest.raises(ConfigurationError, match="must be called through|BarrierRunner"):
        elastic.run(lambda state: None)(elastic.TorchState(model=model))


def test_commit_and_restore_go_back_to_the_last_commit():
    model = torch.nn.Linear(2, 1)
    state = elastic.TorchState(model=model, step=0)
    state.step = 3
    state.commit()
    with torch.no_grad():
        model.weight.add_(1.0)
    kept = model.weight.detach().clone()
    state.step = 4
    state.restore()
    assert state.step == 3 and state.commits == 1
    assert torch.allclose(model.weight, kept - 1.0)


def test_a_state_crosses_with_any_dtype_large_counters_and_tuples_kept():
    """uint16 and float8 tensors (gloo has neither) cross as bytes; a 10^6-float counter is one JSON
    array, not a million objects (was 4-6 s and +254 MiB at each sync); tuples stay tuples."""
    out = BarrierRunner(-2, timeout=120).run(eh.state_crossing, return_all=True)
    got = out[1]
    assert got["u16"] == [7, 8, 9, 10, 11] and got["u16_dtype"] == "torch.uint16"
    assert got["f8"] == [2.0, 2.0, 2.0] and got["f8_dtype"] == "torch.float8_e4m3fn"
    assert got["flag"] is True and got["empty"] == [0, 3]
    assert got["losses"] == (10**6, 0.5, 0.5)
    assert got["pair"] == (1, "x")
    assert got["nested"] == {3: (1.5, [1]), "__sd_t": "a text key that looks like a tag"}
    # the time is a guard against the old way (4-6 s), with room for a loaded machine (2.2 s seen in a
    # CI-like run); the memory is the firmer witness
    assert got["seconds"] < 3.5 and got["grown_mib"] < 150, got


def test_counters_only_some_ranks_hold_are_refused_by_name():
    from sparkml_dist import WorkerError

    with pytest.raises(WorkerError, match=r"'only_here' only on ranks \[1\]"):
        BarrierRunner(-2, timeout=120).run(eh.uneven_counters)
    assert_no_rank_left()
