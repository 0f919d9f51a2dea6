"""``sparkml-dist tune --conf job.yaml``: a Tuner described by a YAML job file.  [driver]

Job file::

    function: train_mnist:train          # module:function (the job file's folder is on sys.path),
                                         # or path/to/file.py:function (relative to the job file)
    space:
      lr: {loguniform: [0.0001, 0.1]}    # uniform, loguniform, quniform, randint, lograndint, choice
      hidden: [32, 64, 128]              # a list: one of these
      epochs: 10                         # a constant
    metric: loss
    mode: min
    sampler: tpe                         # grid | random | tpe
    max_trials: 32
    max_concurrent: null                 # null: as many as slots and memory allow
    early_stopping: {policy: median, startup_trials: 4}   # or bandit / truncation, or null
    trial_resources: {cpus: 1}
    timeout: null
    seed: 0
    mlflow: false
    output: {trials_csv: out/trials.csv}   # relative: under the job file's folder

A function from a module that is not an installed package (a file beside the job) travels to the
executors by value, so they need not have it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any, Dict

from .. import serialization
from ..errors import ConfigurationError
from ..formats.files import write_new
from . import space as spaces

_BUILDERS = {
    name: getattr(spaces, name)
    for name in ("uniform", "loguniform", "quniform", "randint", "lograndint", "choice")
}


def load_function(ref: str, base_dir: str):
    """``module:function`` imported with ``base_dir`` first on sys.path, or ``file.py:function``
    (relative to ``base_dir``)."""
    if not isinstance(ref, str) or ":" not in ref:
        raise ConfigurationError(
            f"function must be 'module:function' or 'path/to/file.py:function', got {ref!r}"
        )
    module_name, _, name = ref.rpartition(":")
    try:
        module = _import(module_name, base_dir)
    except (ImportError, OSError) as exc:
        raise ConfigurationError(f"function {ref!r}: cannot import {module_name!r} ({exc})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigurationError(f"function {ref!r}: {module_name!r} has no function {name!r}")
    if not _installed(module):
        serialization.ship_by_value(module)
    return fn


def _import(module_name: str, base_dir: str):
    if module_name.endswith(".py"):
        path = os.path.join(base_dir, module_name)
        name = "sparkml_dist_tune_" + os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or not os.path.isfile(path):
            raise ImportError(f"no file {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # cloudpickle looks functions up by their module
        spec.loader.exec_module(module)
        return module
    if base_dir not in sys.path:
        sys.path.insert(0, base_dir)
    return importlib.import_module(module_name)


def _installed(module) -> bool:
    path = os.path.abspath(getattr(module, "__file__", "") or "")
    return any(part in path.split(os.sep) for part in ("site-packages", "dist-packages"))


def parse_space(spec: Any) -> Dict[str, Any]:
    """The YAML space: ``{name: [values] | {builder: [args]} | constant}``."""
    if not isinstance(spec, dict):
        raise ConfigurationError(f"space must be a mapping of parameter name to values, got {spec!r}")
    out = {}
    for name, value in spec.items():
        if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in _BUILDERS:
            builder, args = next(iter(value.items()))
            args = args if isinstance(args, list) else [args]
            try:
                out[name] = _BUILDERS[builder](*args) if builder != "choice" else spaces.choice(args)
            except (TypeError, ValueError) as exc:
                raise ConfigurationError(f"space[{name!r}]: {builder}{tuple(args)}: {exc}") from None
        elif isinstance(value, dict):
            raise ConfigurationError(
                f"space[{name!r}]: a mapping names one of {sorted(_BUILDERS)}, e.g. "
                f"{{loguniform: [0.0001, 0.1]}}; got {value!r}"
            )
        else:
            out[name] = value
    return out


def run_tune_job(spark, job: Dict[str, Any], base_dir: str = ".") -> Dict[str, Any]:
    """Run the Tuner ``job`` describes; a report of the best trial and the trials' states."""
    from .tuner import Tuner

    known = {
        "function", "space", "metric", "mode", "sampler", "max_trials", "max_concurrent", "early_stopping",
        "trial_resources", "timeout", "seed", "mlflow", "progress", "output",
    }  # fmt: skip
    unknown = sorted(set(job) - known)
    if unknown:
        raise ConfigurationError(f"tune job: unknown keys {unknown}; known keys are {sorted(known)}")
    fn = load_function(job.get("function"), os.path.abspath(base_dir))
    settings = {k: v for k, v in job.items() if k not in ("function", "space", "output")}
    if "max_trials" not in settings:
        raise ConfigurationError("tune job: max_trials is required")
    result = Tuner(fn, parse_space(job.get("space")), spark=spark, **settings).run()
    trials = result.trials
    report = {
        "best_params": result.best_params,
        "best_value": result.best_value,
        "best_trial": result.best_trial,
        "trials": int(len(trials)),
        "states": {str(k): int(v) for k, v in trials["state"].value_counts().items()},
        "wall_seconds": round(result.wall_seconds, 2),
    }
    out = job.get("output") or {}
    if out.get("trials_csv"):
        write_new(out["trials_csv"], trials.drop(columns=["returned"]).to_csv(index=False).encode())
        report["trials_csv"] = out["trials_csv"]
    return report
