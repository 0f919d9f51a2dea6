"""The executors' Python, checked before a run starts any rank (sparkml_dist.executors): an
interpreter that lacks what the function imports, or holds other versions of it, is refused in a
few lines naming the host, the interpreter, the package and both versions.

Real interpreters only: an empty virtual environment (what a cluster's bare ``python3`` is to this
package), and this Python with a real, other release of tqdm installed by pip into a folder of its
own put first on one executor's path (local-cluster: one executor of two)."""

import os
import subprocess
import sys

import pytest

from sparkml_dist import ConfigurationError, executors
from sparkml_dist.runner import BarrierRunner
from tests.conftest import masters
from tests.support import runner_helpers as h


@pytest.fixture
def python_exec(spark):
    """Set the executors' interpreter for one test (classic Spark: the driver's choice), then back."""
    before = spark.sparkContext.pythonExec
    executors._checked.clear()

    def use(path):
        spark.sparkContext.pythonExec = path

    yield use
    spark.sparkContext.pythonExec = before
    executors._checked.clear()


@masters("local")
def test_an_executor_python_without_the_packages_is_refused_before_any_rank_starts(
    spark, tmp_path, python_exec
):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python_exec(str(venv / "bin" / "python"))
    with pytest.raises(ConfigurationError) as err:
        BarrierRunner(2, timeout=120).run(h.world_with_tqdm)
    text = str(err.value)
    assert len(text.splitlines()) <= 10, text
    assert text.startswith("the executors' Python cannot run world_with_tqdm (checked before any rank")
    for package in ("numpy", "pyarrow", "torch", "tqdm"):
        assert f"{venv}/bin/python" in text and f" {package} " in text and "(missing)" in text
    assert "spark.pyspark.python" in text and "PYSPARK_PYTHON" in text
    executors._checked.clear()
    python_exec(sys.executable)
    assert BarrierRunner(2, timeout=120).run(h.world_with_tqdm)[0] == 2  # this Python: it runs


@masters("local")
def test_the_check_runs_once_a_session_and_not_again_for_the_same_function(spark, python_exec, monkeypatch):
    calls = []
    real = executors._probe
    monkeypatch.setattr(executors, "_probe", lambda *a: calls.append(a) or real(*a))
    runner = BarrierRunner(2, timeout=120)
    assert runner.run(h.world_with_tqdm)[0] == runner.run(h.world_with_tqdm)[0] == 2
    assert len(calls) == 1 and {m for m, _ in calls[0][1]} >= {
        "numpy",
        "pyarrow",
        "sparkml_dist",
        "torch",
        "tqdm",
    }


@masters("cluster")
def test_an_executor_with_another_version_of_a_package_is_refused_naming_both(spark, tmp_path, python_exec):
    """Executor 1 of local-cluster[2,1,1024] runs this Python with another release of tqdm first
    on its path (a real one, installed by pip); executor 0 runs this Python as it is."""
    import importlib.metadata as md

    mine = md.version("tqdm")
    other = "4.65.0" if mine != "4.65.0" else "4.64.1"
    target = tmp_path / "other-tqdm"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            f"tqdm=={other}",
        ],
        check=True,
        timeout=300,
    )
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case "$PWD" in */1) export PYTHONPATH="{target}${{PYTHONPATH:+:$PYTHONPATH}}";; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    os.chmod(wrapper, 0o755)
    python_exec(str(wrapper))
    with pytest.raises(ConfigurationError) as err:
        BarrierRunner(2, timeout=120).run(h.world_with_tqdm)
    text = str(err.value)
    lines = [ln for ln in text.splitlines() if " tqdm " in ln]
    assert len(lines) == 1 and mine in lines[0] and other in lines[0], text  # one executor, both versions
    assert "versionCheck=warn" in text
    spark.conf.set(executors.SETTING, "warn")  # the user accepts it: the run goes on
    try:
        assert BarrierRunner(2, timeout=120).run(h.world_with_tqdm)[0] == 2
    finally:
        spark.conf.unset(executors.SETTING)
