"""The search space of a :class:`~sparkml_dist.tune.Tuner`, as Optuna distributions.  [driver]

A space is a dict from parameter name to one of:

* a list or tuple of values: a choice among them (``CategoricalDistribution``);
* :func:`uniform`, :func:`loguniform`, :func:`quniform`, :func:`randint`, :func:`lograndint`,
  :func:`choice` (thin, named builders of Optuna distributions), or any
  ``optuna.distributions.BaseDistribution`` as is;
* anything else (a number, a string, None): a constant every trial gets.

The grid sampler needs every varying parameter to be enumerable: a list, :func:`choice`, an
integer range or a float range with a ``step``.

Example::

    from sparkml_dist import tune

    space = {"lr": tune.loguniform(1e-4, 1e-1), "layers": [1, 2, 3], "batch": tune.randint(16, 128, 16),
             "epochs": 10}
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from ..errors import ConfigurationError

try:
    from optuna import distributions as _d
except ImportError:  # pragma: no cover - depends on the environment
    _d = None


def _optuna():
    if _d is None:
        raise ImportError(
            "sparkml_dist.tune needs optuna (its samplers and pruners): pip install 'sparkml_dist[tune]'"
        )
    return _d


def uniform(low: float, high: float) -> Any:
    """A float drawn uniformly from ``[low, high]``."""
    return _optuna().FloatDistribution(float(low), float(high))


def quniform(low: float, high: float, step: float) -> Any:
    """A float from ``low, low + step, ..., high`` (enumerable: the grid sampler takes it)."""
    return _optuna().FloatDistribution(float(low), float(high), step=float(step))


def loguniform(low: float, high: float) -> Any:
    """A float whose logarithm is uniform on ``[log low, log high]`` (learning rates)."""
    return _optuna().FloatDistribution(float(low), float(high), log=True)


def randint(low: int, high: int, step: int = 1) -> Any:
    """An integer from ``low`` to ``high`` inclusive, by ``step``."""
    return _optuna().IntDistribution(int(low), int(high), step=int(step))


def lograndint(low: int, high: int) -> Any:
    """An integer from ``low`` to ``high`` inclusive, uniform in log scale."""
    return _optuna().IntDistribution(int(low), int(high), log=True)


def choice(values: Sequence[Any]) -> Any:
    """One of ``values`` (None, bool, int, float or str each, as Optuna stores them)."""
    return _optuna().CategoricalDistribution(list(values))


def parse(space: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """``(distributions, constants)`` of ``space``; a ConfigurationError naming what is wrong."""
    d = _optuna()
    if not isinstance(space, dict) or not space:
        raise ConfigurationError(
            f"space must be a non-empty dict of parameter name -> values or distribution, got {space!r}; "
            "e.g. space={'lr': tune.loguniform(1e-4, 1e-1), 'layers': [1, 2, 3]}"
        )
    dists: Dict[str, Any] = {}
    constants: Dict[str, Any] = {}
    for name, value in space.items():
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"space: parameter names are non-empty strings, got {name!r}")
        try:
            if isinstance(value, d.BaseDistribution):
                dists[name] = value
            elif isinstance(value, (list, tuple)):
                if not value:
                    raise ValueError("an empty list of choices")
                dists[name] = d.CategoricalDistribution(list(value))
            else:
                constants[name] = value
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"space[{name!r}]: {exc}") from None
    if not dists:
        raise ConfigurationError(
            f"space has no parameter to search ({sorted(constants)} are constants): give at least one "
            "list of values or distribution"
        )
    return dists, constants


def grid_values(dists: Dict[str, Any]) -> Dict[str, List[Any]]:
    """Every value of each distribution, for Optuna's GridSampler; refuses continuous ranges."""
    d = _optuna()
    grid: Dict[str, List[Any]] = {}
    for name, dist in dists.items():
        if isinstance(dist, d.CategoricalDistribution):
            grid[name] = list(dist.choices)
        elif isinstance(dist, d.IntDistribution) and not dist.log:
            grid[name] = list(range(dist.low, dist.high + 1, dist.step))
        elif isinstance(dist, d.FloatDistribution) and dist.step is not None and not dist.log:
            n = int(round((dist.high - dist.low) / dist.step))
            grid[name] = [dist.low + i * dist.step for i in range(n + 1)]
        else:
            raise ConfigurationError(
                f"sampler='grid' enumerates every value, but space[{name!r}] is {dist!r}, a continuous "
                "range: give a list, tune.quniform(low, high, step) or tune.randint(...), or use "
                "sampler='random' / 'tpe'"
            )
    return grid


def grid_size(grid: Dict[str, List[Any]]) -> int:
    size = 1
    for values in grid.values():
        size *= len(values)
    return size
