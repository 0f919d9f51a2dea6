"""A run's communication settings, ``BarrierRunner(comm={...})``: checked once, read by each rank.  [anywhere]

One vocabulary for DDP and Horovod (the documents' *fusion buffer*, *gradient accumulation* and
*compression*), so a run switches backend without renaming its settings:

* ``bucket_cap_mb``: DDP's bucket size (default 25 MiB); Horovod's fusion threshold
  (``HOROVOD_FUSION_THRESHOLD``, default 128 MiB);
* ``accumulate=k``: DDP's ``micro_step()`` all-reduces on 1 of k; Horovod's
  ``backward_passes_per_step=k``;
* ``compression``: DDP None, ``"fp16"``, ``"bf16"`` (nccl) or ``"powersgd"``; Horovod None or
  ``"fp16"`` (``hvd.Compression.fp16``);
* DDP only: ``powersgd_rank`` (default 1), ``powersgd_start`` (plain steps first, default 2),
  ``static_graph``;
* DDP only: ``reduction_servers=k``, ``k`` CPU processes beside the workers that sum the
  gradients (each worker sends and receives each byte once, not ``2 (np - 1) / np`` times:
  :mod:`sparkml_dist.runner.backends.reducers`); the job holds ``np + k`` tasks. With
  ``compression="fp16"`` or ``"bf16"`` (on CPU too) the shards and sums travel in half precision
  and the servers add in float32;
* Horovod only: ``cycle_time_ms`` (``HOROVOD_CYCLE_TIME``), ``hierarchical``
  (``HOROVOD_HIERARCHICAL_ALLREDUCE``: Horovod's NCCL path).

The driver refuses a name the backend has no meaning for, naming the backend (never ignored), and
values out of range naming the setting.  The settings reach every rank, on every attempt, as
``SPARKML_DIST_COMM`` (JSON) in its environment: ``comm.ddp(model)`` and ``comm.horovod(opt,
model)`` take them as their defaults (an argument given there wins).  What Horovod reads only when
``hvd.init()`` starts it (fusion threshold, cycle time, hierarchical all-reduce) is also set as its
own ``HOROVOD_*`` variables, so code that calls ``hvd.DistributedOptimizer`` directly gets them too.

Example::

    BarrierRunner(2, comm={"compression": "powersgd", "powersgd_rank": 4}).run(train)
    BarrierRunner(2, backend="horovod", comm={"bucket_cap_mb": 64, "compression": "fp16"}).run(train)
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, Optional, Sequence, Tuple

from ..errors import ConfigurationError

ENV = "SPARKML_DIST_COMM"
COMPRESSIONS = (None, "fp16", "bf16", "powersgd")
DEFAULTS: Dict[str, Any] = {
    "bucket_cap_mb": None,
    "accumulate": 1,
    "compression": None,
    "powersgd_rank": 1,
    "powersgd_start": 2,
    "static_graph": False,
    "cycle_time_ms": None,
    "hierarchical": False,
    "reduction_servers": None,
}
# which settings and compressions a backend takes is the backend's to say
# (Backend.comm_names, Backend.compressions: sparkml_dist.runner.backends)


# the largest value of each numeric setting: beyond it a setting is a typo or an attack, and a
# cycle time must also leave the first all-reduce well inside the run's collective_timeout
LIMITS = {
    "bucket_cap_mb": 1 << 20,  # MiB: 1 TiB of gradients in one bucket
    "accumulate": 1 << 20,
    "powersgd_rank": 4096,
    "powersgd_start": 1 << 31,
    "cycle_time_ms": 1000.0,  # Horovod's default is 1 ms; a second is already a long tick
    "reduction_servers": 1024,
}


def _positive(where: str, name: str, value: Any, integer: bool) -> None:
    kinds = (int,) if integer else (int, float)
    ok = not isinstance(value, bool) and isinstance(value, kinds)
    if not ok or not math.isfinite(value) or value <= 0 or value > LIMITS[name]:
        what = "a positive integer" if integer else "a positive number"
        raise ConfigurationError(
            f"{where}: {name} must be {what} (finite, <= {LIMITS[name]:g}), got {value!r}"
        )


def check_values(
    where: str,
    settings: Dict[str, Any],
    compressions: Sequence = COMPRESSIONS,
    collective_timeout: Optional[float] = None,
    backend: str = "torch",
) -> None:
    """Each value finite and in range, refused naming ``where`` (``comm={...}``, ``comm.ddp``) and
    the setting; ``cycle_time_ms`` also below a tenth of ``collective_timeout`` (seconds)."""
    for name in ("accumulate", "powersgd_rank", "powersgd_start", "reduction_servers"):
        if settings.get(name) is not None:
            _positive(where, name, settings[name], integer=True)
    for name in ("bucket_cap_mb", "cycle_time_ms"):
        if settings.get(name) is not None:
            _positive(where, name, settings[name], integer=False)
    cycle = settings.get("cycle_time_ms")
    if cycle is not None and collective_timeout and cycle / 1000.0 > collective_timeout / 10:
        raise ConfigurationError(
            f"{where}: cycle_time_ms={cycle} is more than a tenth of collective_timeout="
            f"{collective_timeout:g} s: each all-reduce would wait that long before it starts; lower it "
            "(Horovod's default is 1 ms) or raise collective_timeout"
        )
    for name in ("static_graph", "hierarchical"):
        if name in settings and not isinstance(settings[name], bool):
            raise ConfigurationError(f"{where}: {name} must be True or False, got {settings[name]!r}")
    if settings.get("compression") not in compressions:
        raise ConfigurationError(
            f"{where}: compression must be one of {tuple(compressions)} on the {backend} backend, "
            f"got {settings['compression']!r}"
        )


def check(
    comm: Optional[dict], backend, use_gpu: bool, collective_timeout: Optional[float] = None
) -> Dict[str, Any]:
    """``BarrierRunner(comm=...)``: the settings, each name one ``backend`` (its
    :class:`~sparkml_dist.runner.backends.base.Backend`) knows and each value in range; what it
    cannot do on this run's devices refused naming it."""
    if comm is None:
        return {}
    if not isinstance(comm, dict):
        raise ConfigurationError(
            f"comm must be a dict of settings ({sorted(DEFAULTS)}), got {type(comm).__name__}"
        )
    spec = backend
    known, backend = spec.comm_names, spec.name
    if not known:
        raise ConfigurationError(
            f"comm={{...}} sets torch DDP's and Horovod's communication; backend={backend!r} has its "
            "own (TensorFlow's CollectiveCommunication, JAX's collectives): leave comm out"
        )
    unknown = sorted(k for k in comm if k not in DEFAULTS)
    if unknown:
        raise ConfigurationError(f"comm: unknown settings {unknown}; the settings are {sorted(DEFAULTS)}")
    foreign = sorted(k for k in comm if k not in known)
    if "reduction_servers" in foreign:
        raise ConfigurationError(
            f"comm: reduction_servers is for backend='torch' (a DDP communication hook sends the "
            f"buckets to the servers); the {backend} backend has no hook for it (Horovod's public API "
            "reduces inside its own C++ core): leave it out, or run the program on backend='torch'"
        )
    if foreign:
        raise ConfigurationError(
            f"comm: {foreign} mean nothing to the {backend} backend (its settings: {list(known)}); "
            "leave them out or choose the backend they belong to"
        )
    check_values("comm", comm, spec.compressions, collective_timeout, backend)
    servers = comm.get("reduction_servers")
    if comm.get("compression") == "bf16" and not use_gpu and not servers:
        raise ConfigurationError(
            "comm: compression='bf16' needs the nccl backend (use_gpu=True); on CPU the ranks use gloo, "
            "which cannot all-reduce bfloat16: use 'fp16' or None (or reduction_servers, which add "
            "bfloat16 shards in float32)"
        )
    if servers and (use_gpu or comm.get("compression") == "powersgd"):
        raise ConfigurationError(
            "comm: reduction_servers sum the gradients on CPU servers; "
            + ("use_gpu=True is not taken with them yet (the servers would hold GPUs like the "
               "workers)" if use_gpu else "compression='powersgd' is not taken with them (its "
               "factors are all-reduced among the workers; the servers take 'fp16' or 'bf16')")
            + ": leave one of the two out"
        )  # fmt: skip
    if comm.get("hierarchical") and not use_gpu:
        raise ConfigurationError(
            "comm: hierarchical=True is Horovod's NCCL all-reduce (within a host, then across hosts); "
            "on CPU Horovod all-reduces with gloo, which has no hierarchical mode: leave it out"
        )
    return dict(comm)


def horovod_env(settings: Dict[str, Any]) -> Dict[str, str]:
    """The ``HOROVOD_*`` variables Horovod reads when ``hvd.init()`` starts it."""
    env = {}
    if settings.get("bucket_cap_mb") is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(round(settings["bucket_cap_mb"] * 2**20)))
    if settings.get("cycle_time_ms") is not None:
        env["HOROVOD_CYCLE_TIME"] = repr(float(settings["cycle_time_ms"]))
    if settings.get("hierarchical"):
        env["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1"
    return env


def rank_env(settings: Dict[str, Any], backend) -> Tuple[Tuple[str, str], ...]:
    """What every rank's environment holds for ``settings`` (nothing when there are none): the
    settings as JSON, and what ``backend`` reads of them at its start (``Backend.comm_env``)."""
    if not settings:
        return ()
    env = {ENV: json.dumps(settings, sort_keys=True), **backend.comm_env(settings)}
    return tuple(env.items())


def reserved_env(settings: Dict[str, Any], backend) -> Dict[str, str]:
    """The variables ``settings`` set for every rank -> "comm=" (refused in ``env=``)."""
    return {name: "comm=" for name, _ in rank_env(settings, backend)}


def of_run() -> Dict[str, Any]:
    """In a rank: the run's ``comm=`` settings (empty outside a run, or when it set none)."""
    text = os.environ.get(ENV)
    if not text:
        return {}
    try:
        loaded = json.loads(text)
    except ValueError as e:
        raise ConfigurationError(f"{ENV} is not the JSON the runner writes ({e}): unset it") from e
    if not isinstance(loaded, dict):
        raise ConfigurationError(f"{ENV} must hold a JSON object of settings, got {type(loaded).__name__}")
    return loaded


def resolve(given: Dict[str, Any]) -> Dict[str, Any]:
    """The settings a rank uses: an argument given (not None) wins over the run's, which win over
    the defaults."""
    run = of_run()
    return {k: given[k] if given.get(k) is not None else run.get(k, DEFAULTS[k]) for k in given}
