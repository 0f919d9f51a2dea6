"""Tuner on a real Spark session: samplers, early stopping, failures, concurrency, nested runners."""

import pytest

from sparkml_dist import ConfigurationError, WorkerError, tune
from tests.conftest import IS_CONNECT, masters
from tests.support import tune_helpers as th

FAST = {"pause": 0.02}


def run(fn, space, **kw):
    kw.setdefault("metric", "loss")
    kw.setdefault("progress", False)
    return tune.Tuner(fn, space, **kw).run()


@masters("local", "connect", "cluster")  # what separate executor JVMs can change
def test_grid_runs_every_combination_once_and_finds_the_best(spark):
    space = {"x": [0.0, 0.3, 0.6, 0.9], "steps": [2, 3], **FAST}
    r = run(th.curve, space, sampler="grid", max_trials=100, seed=1)
    combos = sorted(zip(r.trials["params_x"], r.trials["params_steps"]))
    assert combos == sorted((x, s) for x in space["x"] for s in space["steps"])  # capped at the grid's 8
    assert (r.trials["state"] == "complete").all()
    assert r.best_params["x"] == 0.3 and r.best_params["steps"] == 3
    assert r.best_value == pytest.approx(1.0 / 3)
    assert r.trials.loc[r.trials["trial"] == r.best_trial, "steps"].item() == 3  # reports counted


@masters("local")
def test_random_is_seeded_and_tpe_with_one_slot_too(spark):
    space = {"x": tune.uniform(0, 1), "steps": 1, "pause": 0.0}
    a = run(th.curve, space, max_trials=6, seed=5)
    b = run(th.curve, space, max_trials=6, seed=5)
    c = run(th.curve, space, max_trials=6, seed=6)
    assert list(a.trials["params_x"]) == list(b.trials["params_x"])
    assert list(a.trials["params_x"]) != list(c.trials["params_x"])
    t1 = run(th.curve, space, sampler="tpe", max_trials=12, max_concurrent=1, seed=3)
    t2 = run(th.curve, space, sampler="tpe", max_trials=12, max_concurrent=1, seed=3)
    assert list(t1.trials["params_x"]) == list(t2.trials["params_x"])
    assert abs(t1.best_params["x"] - 0.3) < 0.15


@pytest.mark.parametrize(
    "policy",
    [
        {"policy": "median", "startup_trials": 2},
        {"policy": "bandit", "slack_factor": 0.05, "delay_evaluation": 1},
        tune.TruncationSelection(truncation_percentage=50, startup_trials=2),
    ],
    ids=["median", "bandit", "truncation"],
)
@masters("local")
def test_early_stopping_stops_poor_trials_and_keeps_the_best(spark, policy):
    xs = [0.3, 0.95, 0.35, 0.9, 0.85, 0.8, 0.28, 0.99]
    space = {"x": xs, "steps": 8, **FAST}
    kw = dict(sampler="grid", max_trials=8, seed=0, max_concurrent=2)
    full = run(th.curve, space, **kw)
    early = run(th.curve, space, **kw, early_stopping=policy)
    stopped = early.trials[early.trials["state"] == "stopped"]
    assert len(stopped) >= 2, early.trials
    assert (stopped["steps"] < 8).all() and (stopped["stop_reason"] == "early stopping").all()
    assert stopped["params_x"].min() >= 0.8  # only the poor ones
    assert early.best_params == full.best_params and early.best_params["x"] == 0.3
    # a stopped trial ended cleanly: its value is its last reported loss
    for _, row in stopped.iterrows():
        last = row["last_step"]
        assert row["value"] == pytest.approx((row["params_x"] - 0.3) ** 2 + 1.0 / (last + 1))


def test_a_failing_trial_is_recorded_and_the_tuning_goes_on(spark):
    r = run(th.fails_for_negative, {"x": [-1.0, 2.0, 3.0]}, sampler="grid", max_trials=3)
    failed = r.trials[r.trials["state"] == "failed"]
    assert list(failed["params_x"]) == [-1.0]
    assert "deliberate failure for x=-1.0" in failed["error"].item()
    assert "Traceback" in failed["error"].item()
    assert r.best_params == {"x": 2.0} and r.best_value == 4.0
    with pytest.raises(WorkerError, match="all 2 trials failed"):
        run(th.fails_for_negative, {"x": [-1.0, -2.0]}, sampler="grid", max_trials=2)


@pytest.mark.parametrize("limit", [1, 2])
def test_concurrency_never_exceeds_max_concurrent(spark, limit):
    r = run(th.timed, {"x": tune.uniform(0, 1), "pause": 0.4}, max_trials=5, max_concurrent=limit, seed=0)
    assert (r.trials["state"] == "complete").all()
    spans = [(out["start"], out["end"]) for out in r.trials["returned"]]
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, delta in points:
        running += delta
        peak = max(peak, running)
    assert peak <= limit
    if limit == 2:
        assert peak == 2  # and the slots were used


@masters("local")
def test_the_metric_returned_reported_or_missing(spark):
    r = run(th.curve, {"x": [0.5], "steps": 3, "return_none": True, **FAST}, sampler="grid", max_trials=1)
    assert r.best_value == pytest.approx(0.04 + 1.0 / 3)  # the last reported loss counts
    with pytest.raises(ConfigurationError, match=r"metric='loss' was never reported.*\['accuracy'\]"):
        run(th.reports_other, {"x": [1, 2]}, sampler="grid", max_trials=2)


def test_timeout_stops_running_trials_cleanly(spark):
    """The trials report until told to stop. How many steps they reach before the timeout depends on how
    fast a loaded machine starts their tasks (one step was seen on a busy CI machine), so the test asks only
    that each was running (reported) when the timeout stopped it, and that the tuning ended soon after."""
    r = run(th.until_stopped, {"x": [1, 2, 3, 4]}, sampler="grid", max_trials=4, max_concurrent=2, timeout=4)
    states = r.trials["state"].tolist()
    assert states.count("stopped") == 2 and len(states) == 2, r.trials  # the others never started
    assert (r.trials["stop_reason"] == "timeout=4s").all()
    assert (r.trials["steps"] >= 1).all() and r.wall_seconds < 20, r.trials


def test_a_trial_may_run_local_ranks_but_not_a_barrier_job(spark):
    r = run(th.nested_runner, {"np": [-2, 2]}, sampler="grid", max_trials=2, trial_resources={"cpus": 1})
    ok = r.trials.set_index("params_np")
    assert ok.loc[-2, "state"] == "complete" and ok.loc[-2, "value"] == -3.0  # 1 + 2 summed by gloo
    assert ok.loc[2, "state"] == "failed"
    assert "BarrierRunner(np=2) inside Tuner trial" in ok.loc[2, "error"]
    assert "np=-k" in ok.loc[2, "error"]


def test_bad_input_is_refused_before_any_job(spark):
    ok = dict(metric="loss", max_trials=2)
    cases = [
        ({}, ok, "space must be a non-empty dict"),
        ({"x": []}, ok, r"space\['x'\]: an empty list"),
        ({"x": 1}, ok, "space has no parameter to search"),
        ({"x": [1]}, {**ok, "sampler": "bayes"}, "sampler must be one of"),
        ({"x": [1]}, {**ok, "early_stopping": "hyperband"}, "unknown policy 'hyperband'"),
        ({"x": [1]}, {**ok, "max_trials": 0}, "max_trials must be an integer >= 1"),
        ({"x": [1]}, {**ok, "metric": ""}, "metric must name"),
        ({"x": [1]}, {**ok, "mode": "best"}, r"mode must be one of \('min', 'max'\), got 'best'"),
        ({"x": tune.uniform(0, 1)}, {**ok, "sampler": "grid"}, r"space\['x'\].*continuous"),
        ({"x": [1]}, {**ok, "trial_resources": {"tpus": 1}}, "trial_resources must be a dict with keys"),
        ({"x": [1]}, {**ok, "early_stopping": {"policy": "bandit", "slack": 1}}, "early_stopping 'bandit'"),
    ]
    for space, kw, message in cases:
        with pytest.raises(ConfigurationError, match=message):
            tune.Tuner(th.curve, space, **kw)
    if not IS_CONNECT:  # local and cluster masters: no GPU here
        from sparkml_dist import InsufficientResourcesError

        with pytest.raises(InsufficientResourcesError, match="asks 1 GPU"):
            run(th.where_gpus, {"x": [1]}, max_trials=1, trial_resources={"gpus": 1})


def test_a_progress_bar_follows_the_trials_and_can_be_turned_off(spark, capsys):
    run(
        th.curve,
        {"x": [0.1, 0.2, 0.3], "steps": 1, "pause": 0.0},
        sampler="grid",
        max_trials=3,
        progress=True,
    )
    err = capsys.readouterr().err
    assert "trials: 100%" in err and "3/3" in err and "best loss=" in err
    run(th.curve, {"x": [0.1], "steps": 1, "pause": 0.0}, sampler="grid", max_trials=1, progress=False)
    assert "trials" not in capsys.readouterr().err


def test_trial_resources_cap_concurrency_and_impossible_ones_are_refused(spark):
    from sparkml_dist import InsufficientResourcesError
    from sparkml_dist.tune import resources

    one_each = resources.plan_slots(spark, resources.check({"cpus": 1}), 1000, None)
    assert one_each.concurrency == 2  # local[2], local-cluster[2,1,...]: two 1-CPU slots
    assert resources.plan_slots(spark, resources.check({"cpus": 1}), 1000, 1).concurrency == 1
    with pytest.raises(InsufficientResourcesError, match="asks 64 CPUs per trial"):
        run(th.curve, {"x": [1]}, max_trials=1, trial_resources={"cpus": 64})


@masters("local")
def test_early_stopping_works_while_500_idle_connections_flood_the_channel(spark, monkeypatch):
    """trials' reports and stop answers still get through."""
    from sparkml_dist.tune import scheduler
    from tests.support.flood import Flood

    real_listen, floods = scheduler.listen, []

    def flooded_listen(*args, **kwargs):
        server = real_listen(*args, **kwargs)
        floods.append(Flood(server.port, 500, server.address).__enter__())
        return server

    monkeypatch.setattr(scheduler, "listen", flooded_listen)
    xs = [0.3, 0.95, 0.35, 0.9, 0.85, 0.8]
    try:
        early = run(
            th.curve,
            {"x": xs, "steps": 8, **FAST},
            sampler="grid",
            max_trials=6,
            seed=0,
            max_concurrent=2,
            early_stopping={"policy": "median", "startup_trials": 2},
        )
    finally:
        for flood in floods:
            flood.__exit__()
    assert floods and floods[0].opened >= 500
    stopped = early.trials[early.trials["state"] == "stopped"]
    assert len(stopped) >= 1 and stopped["params_x"].min() >= 0.8, early.trials
    assert early.best_params["x"] == 0.3


# ------------------------------------------------------------------ trials that are gangs of ranks
@masters("local")
def test_every_rank_of_a_gang_trial_sees_the_same_parameters_and_a_world_of_k(spark):
    r = run(th.gang_curve, {"x": tune.uniform(0, 1), **FAST}, max_trials=3, seed=0, ranks_per_trial=2)
    assert (r.trials["state"] == "complete").all() and len(r.trials) == 3
    for _, row in r.trials.iterrows():
        seen = row["returned"]["seen"]  # [x, world, rank] of each rank, all-gathered in the trial
        assert [s[0] for s in seen] == pytest.approx([row["params_x"]] * 2)
        assert [s[1] for s in seen] == [2.0, 2.0] and [s[2] for s in seen] == [0.0, 1.0]
        assert row["value"] == pytest.approx((row["params_x"] - 0.3) ** 2 + 1.0 / th.STEPS)


@masters("local")
def test_a_gang_stopped_early_leaves_at_the_same_step_on_every_rank(spark):
    """Median stopping over gangs of 2: each stopped trial's ranks all left after the same step
    (the loop all-reduces every step: a rank left behind would hang its peer)."""
    space = {"x": [0.3, 0.31, 0.32, 0.9, 0.95, 1.0], "steps": 12, **FAST}
    r = run(th.gang_curve, space, sampler="grid", max_trials=6, early_stopping="median", ranks_per_trial=2)
    stopped = r.trials[r.trials["state"] == "stopped"]
    assert len(stopped) >= 1, r.trials[["params_x", "state", "last_step"]]
    for _, row in r.trials.iterrows():
        left = row["returned"]["stopped_at"]
        assert len(set(left)) == 1, (row["params_x"], left)
        assert left[0] == row["last_step"]
    assert r.best_params["x"] == pytest.approx(0.3)
    from tests.support.runner_checks import assert_no_rank_left

    assert_no_rank_left()


@masters("local")
def test_a_gang_trial_whose_rank_raises_is_failed_with_its_traceback_and_the_tuning_goes_on(spark):
    space = {"x": [0.5, 0.1, 0.7], "raise_on_rank": 1, "raise_at_x": 0.5, **FAST}
    r = run(th.gang_curve, space, sampler="grid", max_trials=3, ranks_per_trial=2)
    assert sorted(r.trials["state"]) == ["complete", "complete", "failed"]
    failed = r.trials[r.trials["state"] == "failed"]
    assert failed["params_x"].tolist() == [0.5]
    error = failed["error"].item()
    assert "rank 1" in error and "cannot train x=0.5" in error and "ValueError" in error
    assert r.best_params["x"] == 0.1


@masters("local")
def test_a_tunings_data_is_staged_once_for_all_its_gang_trials(spark, monkeypatch):
    from sparkml_dist.runner.data import staging

    writes = []
    stage = staging.stage
    monkeypatch.setattr(staging, "stage", lambda df, root: writes.append(root) or stage(df, root))
    df = spark.range(0, 100, 1, 3).selectExpr("id * 1 AS id")  # computed: not a Parquet scan
    r = run(th.gang_rows, {"x": tune.uniform(0, 1)}, max_trials=3, seed=0, ranks_per_trial=2, data=df)
    assert (r.trials["state"] == "complete").all()
    assert len(writes) == 1  # one copy for the three trials (was one per trial)
    for out in r.trials["returned"]:
        assert out["rows"] == 50  # rank 0's share of the 100 rows


@masters("local")
def test_one_rank_trials_are_as_before_and_gang_settings_are_checked_first(spark):
    r = run(th.curve, {"x": [0.3], **FAST}, sampler="grid", max_trials=1)
    assert r.trials["state"].tolist() == ["complete"]  # ranks_per_trial=1: a one-task trial
    for bad, message in (
        (dict(ranks_per_trial=0), "ranks_per_trial must be an integer >= 1"),
        (dict(ranks_per_trial=2, backend="mpi"), "backend must be one of"),
        (dict(ranks_per_trial=2, trial_resources={"cpus": 2}), "trial_resources is for one-task trials"),
        (dict(ranks_per_trial=8), "ranks_per_trial=8 needs 8 task slots"),
    ):
        with pytest.raises(Exception, match=message):
            run(th.curve, {"x": [0.3]}, sampler="grid", max_trials=1, **bad)


@masters("local")
def test_a_study_in_storage_resumes_where_its_killed_driver_left_it(spark, tmp_path):
    """What a driver killed mid-tuning leaves in the storage (two trials finished, the third
    running), made with Optuna's own calls: started again with the same storage, the tuning keeps
    the two finished trials (their values), runs the third's parameters again and ends with
    max_trials trials, each grid point once."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    from sparkml_dist.tune.tuner import _grid_sampler

    journal = str(tmp_path / "study.log")
    storage = optuna.storages.JournalStorage(JournalFileBackend(journal))
    grid = {"x": [0.0, 0.3, 0.6, 0.9, 0.45]}
    sampler = _grid_sampler(optuna)(grid, seed=0)  # the tuner's own, as the killed driver had it
    study = optuna.create_study(study_name="resumed", storage=storage, direction="minimize", sampler=sampler)
    dist = optuna.distributions.CategoricalDistribution(grid["x"])
    for state in ("done", "done", "running"):
        trial = study.ask({"x": dist})
        if state == "done":
            study.tell(trial, (trial.params["x"] - 0.3) ** 2)
    kept = {t.number: t.value for t in study.get_trials() if t.state.name == "COMPLETE"}
    running = [t.params["x"] for t in study.get_trials() if t.state.name == "RUNNING"]
    r = run(
        th.kills_its_driver, {"x": [0.0, 0.3, 0.6, 0.9, 0.45], "kill_at": -1, "driver": 0}, sampler="grid",
        max_trials=5, storage=journal, study_name="resumed", seed=0,
    )  # fmt: skip
    assert len(r.trials) == 5 and (r.trials["state"] == "complete").all(), r.trials
    for number, value in kept.items():  # the finished trials, as they were
        assert r.trials.set_index("trial").loc[number, "value"] == value
    assert running[0] in r.trials["params_x"].tolist()  # the running one, run again
    assert sorted(r.trials["params_x"]) == sorted(grid["x"])  # each grid point once
    assert r.best_params["x"] == 0.3


@masters("local")
def test_gangs_that_fit_run_together_and_one_that_does_not_waits_without_holding_a_slot(tmp_path):
    """Gangs of 2 on 4 slots: two run at once (their ranks' spans overlap) and the third starts only
    once one of them has ended (no rank of it held a slot meanwhile). Slow (~40 s): a driver of its
    own on local[4] (the pass's session has 2 slots)."""
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    script = tmp_path / "driver.py"
    script.write_text(
        "import json, os, sys\n"
        f"sys.path.insert(0, {ROOT!r})\n"
        "from sparkml_dist.session import get_session\n"
        "from sparkml_dist import tune\n"
        "from tests.support import tune_helpers as th\n"
        "get_session('local[4]', conf_file=os.path.join(sys.path[0], 'conf', 'spark-local.yaml'))\n"
        "r = tune.Tuner(th.gang_timed, {'x': [1.0, 2.0, 3.0], 'pause': 3.0}, metric='loss', sampler='grid',\n"
        "               max_trials=3, ranks_per_trial=2, progress=False).run()\n"
        "print('SPANS ' + json.dumps([out['spans'] for out in r.trials['returned']]))\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    spans = json.loads(next(ln for ln in done.stdout.splitlines() if ln.startswith("SPANS "))[6:])
    trials = sorted(([min(s for s, _ in g), max(e for _, e in g)] for g in spans), key=lambda t: t[0])
    first, second, third = trials
    assert second[0] < first[1], trials  # two gangs at once
    assert third[0] >= min(first[1], second[1]) - 0.05, trials  # the third waited for a whole gang's slots
