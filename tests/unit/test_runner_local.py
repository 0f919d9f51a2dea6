"""BarrierRunner with np < 0: ranks as local processes on the driver, no Spark at all."""

import pytest

from sparkml_dist import ConfigurationError
from sparkml_dist.runner import BarrierRunner
from tests.support.runner_checks import RunnerChecks


@pytest.fixture
def spark():
    return None  # local mode needs no SparkSession


class TestLocalRunner(RunnerChecks):
    np_sign = -1


def test_horovod_backend_without_horovod_says_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "horovod" else real(name, *a)
    )
    with pytest.raises(ConfigurationError, match=r"needs Horovod, which is not installed.*make horovod"):
        BarrierRunner(2, backend="horovod")


def test_bad_constructor_arguments():
    for kwargs, match in (
        (dict(np=0), "np must be a non-zero integer"),
        (dict(np=2, backend="mpi"), "backend must be one of"),
        (dict(np=2, timeout=0), "timeout must be a positive"),
        (dict(np=2, log_ranks="some"), "log_ranks must be"),
    ):
        with pytest.raises(ConfigurationError, match=match):
            BarrierRunner(**kwargs)
