"""Parts of the tuner that need no Spark: the bandit pruner's arithmetic, spaces, the answering
channel, and the package without MLflow."""

import subprocess
import sys
import threading

import optuna
import pytest

from sparkml_dist import ConfigurationError, tune
from sparkml_dist.channel import LogClient, new_secret
from sparkml_dist.channel.server import listen
from sparkml_dist.tune import policies, space


def study_with(direction, curves, pruner):
    """A study whose trials reported ``curves`` (one list of values per trial, steps 0..)."""
    study = optuna.create_study(direction=direction, pruner=pruner)
    for values in curves:
        trial = study.ask()
        for step, value in enumerate(values):
            trial.report(value, step)
        study.tell(trial, values[-1])
    return study


def prunes(study, values):
    trial = study.ask()
    for step, value in enumerate(values):
        trial.report(value, step)
    return trial.should_prune()


def test_bandit_slack_factor_and_amount_both_directions():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    factor = tune.Bandit(slack_factor=0.1).pruner()
    best_max = study_with("maximize", [[0.8]], factor)  # Azure's example: 0.8 / 1.1 = 0.727
    assert prunes(best_max, [0.72]) and not prunes(best_max, [0.73])
    best_min = study_with("minimize", [[2.0]], factor)  # 2.0 * 1.1 = 2.2
    assert prunes(best_min, [2.21]) and not prunes(best_min, [2.19])
    amount = study_with("minimize", [[2.0]], tune.Bandit(slack_amount=0.5).pruner())
    assert prunes(amount, [2.51]) and not prunes(amount, [2.49])


def test_bandit_waits_for_its_delay_and_interval():
    pruner = tune.Bandit(slack_factor=0.0, delay_evaluation=2, evaluation_interval=2).pruner()
    study = study_with("minimize", [[1.0] * 6], pruner)
    assert not prunes(study, [9.0, 9.0])  # steps 0, 1: before the delay
    assert prunes(study, [9.0, 9.0, 9.0])  # step 2 is evaluated
    assert not prunes(study, [9.0, 9.0, 1.0, 9.0])  # step 3 is not


def test_policy_specs_by_name_dict_object_or_pruner():
    assert isinstance(policies.pruner_of("median"), optuna.pruners.MedianPruner)
    trunc = policies.pruner_of({"policy": "truncation", "truncation_percentage": 30})
    assert isinstance(trunc, optuna.pruners.PercentilePruner) and trunc._percentile == 70.0
    assert isinstance(policies.pruner_of("bandit"), policies.BanditPruner)
    mine = optuna.pruners.SuccessiveHalvingPruner()
    assert policies.pruner_of(mine) is mine
    with pytest.raises(ConfigurationError, match="slack_factor or slack_amount, not both"):
        tune.Bandit(slack_factor=0.1, slack_amount=1.0)
    with pytest.raises(ConfigurationError, match=r"truncation_percentage must be in \(0, 100\)"):
        tune.TruncationSelection(truncation_percentage=100)
    with pytest.raises(ConfigurationError, match="evaluation_interval must be an integer >= 1"):
        tune.MedianStopping(evaluation_interval=0)


def test_spaces_and_grids():
    dists, constants = space.parse(
        {"a": [1, 2], "b": tune.quniform(0, 1, 0.5), "c": tune.randint(1, 5, 2), "d": 7}
    )
    assert constants == {"d": 7}
    assert space.grid_values(dists) == {"a": [1, 2], "b": [0.0, 0.5, 1.0], "c": [1, 3, 5]}
    assert space.grid_size(space.grid_values(dists)) == 18
    with pytest.raises(ConfigurationError, match=r"space\['l'\].*continuous"):
        space.grid_values(space.parse({"l": tune.loguniform(1e-3, 1)})[0])


def test_the_channel_answers_each_message_on_its_connection():
    secret = new_secret()
    got = []
    server = listen(secret, lambda msg, send: send({"echo": msg["n"] * 2}), "127.0.0.1", replies=True)
    done = threading.Event()

    def on_frame(frame):
        got.append(frame["echo"])
        if len(got) == 3:
            done.set()

    client = LogClient(server.address, server.port, secret, on_frame=on_frame)
    try:
        for n in (1, 2, 3):
            client.send({"n": n})
        assert done.wait(5) and got == [2, 4, 6]
    finally:
        client.close()
        server.close()


def test_the_package_works_without_mlflow():
    code = (
        "import sys; sys.modules['mlflow'] = None\n"
        "from sparkml_dist import tracking, tune\n"
        "from sparkml_dist.ensemble import BaggingClassifier\n"
        "assert tracking.wanted(None) is False and tracking.wanted(False) is False\n"
        "with tracking.job_run('x', None, {}) as run: assert run.run_id is None\n"
        "try:\n    tracking.wanted(True)\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'sparkml_dist[mlflow]'" in out.stdout


def test_a_trials_rank_imports_the_trial_without_the_tuner_or_optuna():
    """Every gang trial's ranks are new processes: what they import is paid at each trial's start
    (the tuner and Optuna were ~0.1 s of a 0.4 s start); the driver's names still load on use."""
    code = (
        "import sys\n"
        "import sparkml_dist.tune.trial\n"
        "print(sorted(m for m in ('optuna', 'sparkml_dist.tune.tuner', 'sparkml_dist.tune.scheduler')"
        " if m in sys.modules))\n"
        "from sparkml_dist.tune import Tuner, choice\n"
        "print(Tuner.__module__, choice.__module__, 'optuna' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "sparkml_dist.tune.tuner sparkml_dist.tune.space True"]


def test_local_gpus_are_dealt_a_few_at_a_time_and_given_back():
    from sparkml_dist.tune.resources import GpuPool

    pool = GpuPool(["0", "1", "2", "3"], per_trial=2)
    a, b = pool.take(), pool.take()
    assert a == ("0", "1") and b == ("2", "3") and pool.take() == ()
    pool.give(a)
    assert pool.take() == ("0", "1")


def _two_reports(params, trial):
    trial.report(0, loss=2.0)
    trial.report(1, loss=1.0)
    return None


def test_a_trial_that_cannot_reach_the_driver_still_runs_and_brings_its_reports_back():
    import socket

    from sparkml_dist import serialization
    from sparkml_dist.tune.trial import TrialSpec, run_trial

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    payload = serialization.dumps(_two_reports)
    spec = TrialSpec(0, {"x": 1}, payload, serialization.digest(payload), ("127.0.0.1", port), new_secret())
    result = run_trial(spec)
    assert result["ok"] and result["unreachable"].startswith(f"127.0.0.1:{port}")
    assert result["reports"] == {0: {"loss": 2.0}, 1: {"loss": 1.0}}
