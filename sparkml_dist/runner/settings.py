"""A runner's settings, in the groups the runner and its tasks share.  [anywhere]

``BarrierRunner(...)``'s keywords are checked once on the driver and kept in frozen groups of
plain values; the :class:`~sparkml_dist.runner.task_spec.TaskSpec` of every attempt carries the
same groups as they are:

* :class:`Timeouts`: ``start`` (every rank at the rendezvous), ``data`` (a shard that stops
  arriving), ``total`` (the whole run), ``collective`` (a blocked collective);
* :class:`Placement`: the GPUs (``use_gpu``, ``gpus_per_rank``) and what a node is (``nodes``);
* :class:`Logs`: whose lines stream to the driver (``ranks``) and the directory of every rank's
  whole output (``directory``);
* :class:`WorkDir`: where the ranks run (``path``) and whether the default one is removed after
  a success (``clean``);
* :class:`RankEnv`: each rank's environment beyond the rendezvous, in named parts: the user's
  ``env=`` (checked here: :func:`check_env`), the ``comm=`` settings, the MLflow run's variables,
  the checkpoint directory; values whose names look secret (:func:`looks_secret`) are never shown.

Example::

    timeouts = Timeouts.of(start=180.0, data=300.0, total=None, collective=None)
    timeouts.collective                     # 600.0: NCCL's own default, or the total when shorter
    env = RankEnv(user=check_env({"NCCL_SOCKET_IFNAME": "eth0"}))
    dict(env.items())                       # {"NCCL_SOCKET_IFNAME": "eth0"}
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterator, Optional, Tuple

from ..errors import ConfigurationError

DEFAULT_COLLECTIVE_TIMEOUT = 600.0  # seconds: NCCL's own default; torch's gloo default is 1800

RESERVED_ENV = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "NODE_RANK",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
    "CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED",
)  # fmt: skip
_SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD", "KEY", "CREDENTIAL", "AUTH")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # POSIX: what execve can carry as a name


def looks_secret(name: str) -> bool:
    """A variable whose value is never logged or printed."""
    return any(w in name.upper() for w in _SECRET_WORDS)


def check_env(env: Any, reserved: Optional[Dict[str, str]] = None) -> tuple:
    """``env=``: a mapping of names to string values for every rank, each attempt. A name must be
    a POSIX name (letters, digits, ``_``; no ``=``, no NUL) and a value hold no NUL; the names the
    runner sets itself (ranks, rendezvous, GPUs, its own ``SPARKML_DIST_*``) and those in
    ``reserved`` (name -> who sets it: a backend, ``comm=``) are refused by name, never silently
    replaced."""
    if env is None:
        return ()
    if not isinstance(env, dict):
        raise ConfigurationError(f"env must be a dict of variable names to values, got {type(env).__name__}")
    names = [k for k in env if not (isinstance(k, str) and _NAME.fullmatch(k))]
    if names:
        raise ConfigurationError(
            f"env: {names[0]!r} is not a variable name: a name is letters, digits and '_', not starting "
            "with a digit (no '=', spaces or NUL), e.g. {'NCCL_SOCKET_IFNAME': 'eth0'}"
        )
    owners = {**(reserved or {}), **{k: "the runner" for k in RESERVED_ENV}}
    taken = sorted(k for k in env if k in owners or k.startswith("SPARKML_DIST_"))
    if taken:
        who = sorted({owners.get(k, "the runner") for k in taken})
        sets = "sets itself" if len(who) == 1 else "set themselves"
        raise ConfigurationError(
            f"env={{...}} sets {taken}, which {' and '.join(who)} {sets} for each rank (its place in "
            "the run, the rendezvous, its GPUs, the comm= settings): leave them out (a comm= "
            "setting is changed in comm={...})"
        )
    bad = [k for k, v in env.items() if not isinstance(v, (str, int, float, bool))]
    if bad:
        raise ConfigurationError(f"env: the values of {bad} must be strings (or numbers)")
    nul = [k for k, v in env.items() if "\x00" in str(v)]
    if nul:
        raise ConfigurationError(
            f"env: the value of {nul[0]!r} holds a NUL character, which no environment can"
        )
    return tuple((k, str(v)) for k, v in env.items())


Pairs = Tuple[Tuple[str, str], ...]


@dataclass(frozen=True)
class Timeouts:
    """Seconds each wait of a run may last (None: no bound; see ``BarrierRunner``)."""

    start: Optional[float] = 180.0
    data: Optional[float] = 300.0
    total: Optional[float] = None
    collective: float = DEFAULT_COLLECTIVE_TIMEOUT

    @classmethod
    def of(cls, start, data, total, collective) -> "Timeouts":
        """The given timeouts (checked by :func:`.admission.check_arguments`); ``collective`` by
        default 600 s, or the run's total when that is shorter."""
        return cls(start, data, total, float(collective or min(total or 600.0, DEFAULT_COLLECTIVE_TIMEOUT)))


@dataclass(frozen=True)
class Placement:
    """Where each rank runs: its GPUs, and what a node is for LOCAL_RANK and the like."""

    use_gpu: bool = False
    gpus_per_rank: int = 1
    nodes: str = "host"


@dataclass(frozen=True)
class Logs:
    """Whose lines stream to the driver, and where every rank's whole output is kept."""

    ranks: Tuple[int, ...] = (0,)
    directory: Optional[str] = None

    @classmethod
    def of(cls, ranks: Tuple[int, ...], directory: Optional[str]) -> "Logs":
        return cls(tuple(ranks), os.path.abspath(directory) if directory else None)

    def within(self, world: int) -> "Logs":
        """The streamed ranks of a world of ``world`` (fewer after an elastic restart)."""
        return replace(self, ranks=tuple(k for k in self.ranks if k < world))


@dataclass(frozen=True)
class WorkDir:
    """Every rank's working directory (None: torchrun's rule), and whether the default one is
    removed on the executors once every rank succeeded."""

    path: Optional[str] = None
    clean: bool = False


@dataclass(frozen=True)
class RankEnv:
    """Each rank's environment beyond the rendezvous, part by part, in the order they apply."""

    user: Pairs = ()  # env=
    comm: Pairs = ()  # comm=: the settings as JSON, and what the backend reads of them
    tracking: Pairs = ()  # the active MLflow run's
    checkpoint: Pairs = ()  # the checkpoint directory

    def items(self) -> Iterator[Tuple[str, str]]:
        for part in (self.user, self.comm, self.tracking, self.checkpoint):
            yield from part

    def __repr__(self) -> str:  # values may be secrets: names only
        return f"RankEnv({[k for k, _ in self.items()]})"
