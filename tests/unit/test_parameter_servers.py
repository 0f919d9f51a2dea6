"""TensorFlow's parameter-server topology on the runner (``roles=``): the roles' refusals and
TF_CONFIGs (pure), and the tutorial's programs run by the runner's ranks as local processes
(np < 0: a chief, the workers and a parameter server, each its own process); on Spark barrier tasks
across hosts in tests/hosts/test_across_hosts.py."""

import json

import numpy as np
import psutil
import pytest

from sparkml_dist import WorkerError
from sparkml_dist.errors import ConfigurationError
from sparkml_dist.runner import BarrierRunner, backends, protocol, roles
from tests.support import ps_helpers as ps

PEERS = [{"host": "10.0.0.1", "port": 4000 + r, "gpus": None} for r in range(4)]


@pytest.mark.parametrize(
    "kwargs, named",
    [
        (dict(backend="torch", roles={"ps": 1}), "roles= is for backend='tensorflow'"),
        (dict(roles={"pss": 1}), "'pss' is not a role (did you mean 'ps'?)"),
        (dict(roles={"worker": 2, "ps": 1}), "np counts the workers"),
        (dict(roles={"chief": 1}), "roles['ps'] must be a whole number >= 1, got None"),
        (dict(roles={"ps": 0}), "roles['ps'] must be a whole number >= 1, got 0"),
        (dict(roles={"ps": 1, "chief": 2}), "one chief coordinates the run"),
        (dict(roles=["ps"]), "roles must be a dict of role -> count"),
        (dict(roles={"ps": 1}, use_gpu=True), "use_gpu is not taken with roles yet"),
        (dict(roles={"ps": 1}, min_np=1, max_restarts=1), "min_np is not taken with roles yet"),
    ],
)
def test_a_wrong_role_is_refused_before_any_job_naming_the_fix(kwargs, named):
    kwargs = {"backend": "tensorflow", **kwargs}
    with pytest.raises(ConfigurationError) as err:
        BarrierRunner(-2, **kwargs)
    assert named in str(err.value)


def test_roles_refuse_return_all_and_run_with_data_naming_why():
    runner = BarrierRunner(-2, backend="tensorflow", roles={"ps": 1})
    with pytest.raises(ConfigurationError, match="leave return_all out"):
        runner.run(ps.keras_fit, return_all=True)
    with pytest.raises(ConfigurationError, match="run_with_data"):
        runner.run_with_data(object(), ps.keras_fit)


def test_each_rank_gets_its_role_in_a_tf_config_naming_the_whole_cluster():
    tf, two_workers = backends.get("tensorflow"), roles.Roles(workers=2, ps=1)
    assert BarrierRunner(-2, backend="tensorflow", roles={"ps": 1}).world_size == 4
    seen = []
    for rank in range(4):
        env, _ = tf.rank_env(rank, PEERS, None, 600, roles=two_workers)
        config = json.loads(env["TF_CONFIG"])
        assert config["cluster"] == {
            "chief": ["10.0.0.1:4000"],
            "worker": ["10.0.0.1:4001", "10.0.0.1:4002"],
            "ps": ["10.0.0.1:4003"],
        }
        seen.append((config["task"]["type"], config["task"]["index"], env[protocol.ROLE_ENV]))
    assert seen == [("chief", 0, "chief"), ("worker", 0, "worker"), ("worker", 1, "worker"), ("ps", 0, "ps")]
    assert two_workers.label(3) == "rank 3 (parameter server 0)" and two_workers.survives(2)
    assert not two_workers.survives(0) and not two_workers.survives(3)


def test_the_servers_are_told_to_stop_once_the_chief_is_done_even_those_that_report_late():
    stop, sent = roles.StopServers(), []
    stop.reached(1, lambda m: sent.append((1, m["type"])))
    stop.reached(0, lambda m: sent.append((0, m["type"])))  # the chief's own task: nothing to stop
    stop.done(2)  # a worker done: not the end of the run
    assert sent == []
    stop.done(0)
    stop.reached(3, lambda m: sent.append((3, m["type"])))  # its rendezvous report came after
    assert sent == [(1, protocol.FRAME_STOP), (3, protocol.FRAME_STOP)]


def _listening(ports):
    return {c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN} & ports


def _ports(config):
    return {int(a.rsplit(":", 1)[1]) for addrs in config["cluster"].values() for a in addrs}


@pytest.mark.slow
def test_the_tutorials_keras_fit_runs_on_the_chief_and_the_servers_end_with_it():
    """Slow (~10 s): four TensorFlow processes."""
    out = BarrierRunner(-2, backend="tensorflow", roles={"ps": 1}, timeout=240).run(ps.keras_fit)
    config = out["tf_config"]
    assert config["task"] == {"type": "chief", "index": 0}
    assert [len(config["cluster"][r]) for r in ("chief", "worker", "ps")] == [1, 2, 1]
    assert out["loss"][-1] < out["loss"][0] / 100, out["loss"]  # it learned the linear map
    assert not _listening(_ports(config))  # every server ended with the run


@pytest.mark.slow
def test_the_tutorials_custom_loop_on_one_worker_trains_what_one_process_trains():
    """One worker runs the scheduled steps in order, so asynchronous updates are sequential SGD:
    the weights equal one process's over the same batches. Slow (~10 s): three TF processes."""
    out = BarrierRunner(-1, backend="tensorflow", roles={"ps": 1}, timeout=240).run(ps.custom_loop, 24)
    assert out["iterations"] == 24  # every scheduled step ran once
    for got, want in zip(out["weights"], out["one_process"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_killed_worker_is_survived_and_said_on_the_console():
    """Slow (~10 s): four TensorFlow processes, one killed after the first epoch."""
    lines = []
    runner = BarrierRunner(-2, backend="tensorflow", roles={"ps": 1}, timeout=240, log_sink=lines.append)
    out = runner.run(ps.keras_fit, 3, 20, ("worker", 1))
    assert out["killed"] and len(out["loss"]) == 3 and out["loss"][-1] < out["loss"][0] / 100
    said = "".join(lines)
    assert "rank 2 (worker 1) was killed by signal 9 (SIGKILL)" in said and "goes on without it" in said


@pytest.mark.slow
def test_a_killed_parameter_server_fails_the_run_naming_it():
    """Slow (~15 s): four TensorFlow processes, the parameter server killed after the first epoch."""
    runner = BarrierRunner(-2, backend="tensorflow", roles={"ps": 1}, timeout=240, log_ranks="none")
    with pytest.raises(WorkerError) as err:
        runner.run(ps.keras_fit, 3, 20, ("ps", 0))
    assert str(err.value).startswith("rank 3 (parameter server 0) was killed by signal 9"), str(err.value)
