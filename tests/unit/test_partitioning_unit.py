import numpy as np
import pytest

from sparkml_dist import ConfigurationError
from sparkml_dist._spark_env import parse_bytes
from sparkml_dist.group_rows import order_rows
from sparkml_dist.partitioning import SplitSpec, feature_subsets, group_seeds, membership_sql


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_groups=0), "num_groups must be an integer >= 1"),
        (dict(num_groups=2, sampling="random"), "sampling must be one of"),
        (dict(num_groups=2, sample_ratio=0), r"sample_ratio must be in \(0, 1\]"),
        (dict(num_groups=2, sample_ratio=1.5), r"sample_ratio must be in \(0, 1\]"),
        (dict(num_groups=2, feature_ratio=-0.1), r"feature_ratio must be in \(0, 1\]"),
        (dict(num_groups=2, feature_ratio="x"), "feature_ratio must be a number"),
    ],
)
def test_spec_rejects_bad_values(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        SplitSpec(**kwargs)


def test_spec_names_parameters_as_the_caller_calls_them():
    with pytest.raises(ConfigurationError, match="numModels must be"):
        SplitSpec(num_groups=0, names={"num_groups": "numModels"})


def test_feature_subsets_are_seeded_sorted_and_sized():
    spec = SplitSpec(num_groups=5, feature_ratio=0.3, seed=9)
    a, b = feature_subsets(10, spec), feature_subsets(10, spec)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert all(len(s) == 3 and np.all(np.diff(s) > 0) for s in a)
    assert len({tuple(s) for s in a}) > 1
    assert all(np.array_equal(s, np.arange(4)) for s in feature_subsets(4, SplitSpec(num_groups=2)))
    assert group_seeds(spec) == group_seeds(spec) != group_seeds(SplitSpec(num_groups=5, seed=10))


def test_order_rows_is_independent_of_arrival_order():
    rng = np.random.default_rng(0)
    keys = rng.integers(-10, 10, size=200)  # many ties, as bootstrap copies and collisions give
    X = rng.normal(size=(200, 3))
    X[keys == 3] = 1.0  # identical rows
    perm = rng.permutation(200)
    a = order_rows(keys, X)
    b = order_rows(keys[perm], X[perm])
    assert np.array_equal(keys[a], keys[perm][b])
    assert np.array_equal(X[a], X[perm][b])


def test_membership_sql_per_mode():
    assert "pmod" in membership_sql(SplitSpec(num_groups=4))
    assert "filter(sequence(0, 3)" in membership_sql(
        SplitSpec(num_groups=4, sampling="subsample", sample_ratio=0.5)
    )
    boot = membership_sql(SplitSpec(num_groups=4, sampling="bootstrap", sample_ratio=1.0))
    assert "array_repeat" in boot and boot.count(">=") >= 10  # Poisson(1) tail out to 1e-12


def test_parse_bytes():
    assert parse_bytes("2g") == 2 << 30 and parse_bytes("512m") == 512 << 20
    assert parse_bytes("1024") == 1 << 30
