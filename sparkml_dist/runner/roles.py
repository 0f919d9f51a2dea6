"""Servers beside the workers: a chief and parameter servers, or reduction servers.  [anywhere]

``BarrierRunner(np, backend="tensorflow", roles={"ps": p, "chief": 1})`` runs TensorFlow's
parameter-server topology (``tf.distribute.ParameterServerStrategy``): ``np`` counts the workers,
and the job holds ``1 + np + p`` barrier tasks. Rank 0 is the chief (the coordinator: it runs the
function and its result is the run's), ranks ``1 .. np`` the workers, the last ``p`` ranks the
parameter servers; each gets a ``TF_CONFIG`` naming the whole cluster and its own role. Workers
and parameter servers run a ``tf.distribute.Server`` and no user code
(:mod:`sparkml_dist.runner.backends.tf_roles`).

* Checked before any job (:func:`check`): a role spelled wrongly, a count that is not a positive
  number, roles on a backend that has none, and the settings roles do not take, each refused by
  name with the fix.
* The servers end with the run: when rank 0's task reports its function returned
  (``FRAME_RETURNED``: its process may still serve the store a while), the driver tells every
  other task (:class:`StopServers`, ``FRAME_STOP``), whose server then returns.
* A lost worker does not end the run (:meth:`Roles.survives`): TensorFlow's coordinator
  re-schedules its work on the other workers, and its task waits for the end of the run. A lost
  parameter server or chief fails the run naming it (``max_restarts`` then starts it again from the
  checkpoint, as any failure).

``BarrierRunner(np, comm={"reduction_servers": k})`` (torch) is the other topology
(:func:`reduction`): no chief, ranks ``0 .. np-1`` the workers (every one runs the function), the
last ``k`` ranks reduction servers (:mod:`sparkml_dist.runner.backends.reducers`); a lost one
fails the run naming it.

Example::

    roles = check({"ps": 1}, backends.get("tensorflow"), np=2)
    roles.world                     # 4: the chief, 2 workers, 1 parameter server
    roles.of(3), roles.label(3)     # ("ps", 0), "rank 3 (parameter server 0)"
"""

from __future__ import annotations

import difflib
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import ConfigurationError
from . import protocol

NAMES = {"chief": "chief", "worker": "worker", "ps": "parameter server", "reducer": "reduction server"}
_EXAMPLE = "roles={'ps': 2, 'chief': 1}"


@dataclass(frozen=True)
class Roles:
    """How many ranks hold each role; ranks in the order chief, workers, parameter servers,
    reduction servers."""

    workers: int
    ps: int
    chief: int = 1
    reducers: int = 0

    @property
    def world(self) -> int:
        return self.chief + self.workers + self.ps + self.reducers

    @property
    def readers(self) -> int:
        """The ranks that run the function (the first ones): the chief, else every worker; with
        reduction servers they are ``run_with_data``'s data ranks, the servers read no rows."""
        return self.chief or self.workers

    def runs(self, rank: int) -> bool:
        return rank < self.readers

    def of(self, rank: int) -> Tuple[str, int]:
        """Rank ``rank``'s role and its index among that role's ranks (``TF_CONFIG``'s task)."""
        first = 0
        for role, count in (("chief", self.chief), ("worker", self.workers), ("ps", self.ps)):
            if rank < first + count:
                return role, rank - first
            first += count
        return "reducer", rank - first

    def label(self, rank: int) -> str:
        role, index = self.of(rank)
        return f"rank {rank} ({NAMES[role]} {index})"

    def cluster(self, addresses: Sequence[str]) -> Dict[str, List[str]]:
        """``TF_CONFIG``'s cluster: each role's addresses, in rank order."""
        first_ps = self.chief + self.workers
        return {
            "chief": list(addresses[: self.chief]),
            "worker": list(addresses[self.chief : first_ps]),
            "ps": list(addresses[first_ps : self.world]),
        }

    def describe(self) -> str:
        """``"1 chief + 2 workers + 1 parameter server = 4 tasks"``."""
        parts = [(self.chief, "chief"), (self.workers, "worker"), (self.ps, "parameter server")]
        parts.append((self.reducers, "reduction server"))
        said = " + ".join(f"{n} {name}{'s' * (n > 1)}" for n, name in parts if n)
        return f"{said} = {self.world} tasks"

    def survives(self, rank: int) -> bool:
        """Whether the run goes on without this rank's process: a worker's work is re-scheduled
        (by the chief's coordinator: without a chief, every rank is needed)."""
        return self.chief > 0 and self.of(rank)[0] == "worker"


def _count(name: str, value: Any, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"roles[{name!r}] must be a whole number >= 1, got {value!r}: {fix}")
    return value


def check(
    roles: Any, backend, np: Any, *, use_gpu: bool = False, min_np: Optional[int] = None
) -> Optional[Roles]:
    """``roles=`` as given to ``BarrierRunner`` (None: no roles); refused by name with the fix."""
    if roles is None:
        return None
    if not backend.roles:
        raise ConfigurationError(
            f"roles= is for backend='tensorflow' (ParameterServerStrategy: a chief and parameter "
            f"servers beside the workers); backend={backend.name!r} has no server roles: every rank "
            "runs your function. Leave roles out, or run the program with backend='tensorflow'"
        )
    if not isinstance(roles, dict) or not roles:
        raise ConfigurationError(f"roles must be a dict of role -> count, e.g. {_EXAMPLE}; got {roles!r}")
    for name in roles:
        if name == "worker" or name == "workers":
            raise ConfigurationError(
                f"roles: np counts the workers (BarrierRunner(np=2, roles=...) has 2 workers): leave "
                f"{name!r} out of roles, e.g. BarrierRunner({roles[name]!r}, backend='tensorflow', "
                f"{_EXAMPLE})"
            )
        if name not in backend.roles:
            near = difflib.get_close_matches(str(name), backend.roles, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigurationError(
                f"roles: {name!r} is not a role{hint}; the roles are 'ps' (parameter servers) and "
                f"'chief' (the coordinator, which runs your function), e.g. {_EXAMPLE}"
            )
    ps = _count("ps", roles.get("ps"), f"give the parameter servers, e.g. {_EXAMPLE}")
    chief = _count("chief", roles.get("chief", 1), "one chief coordinates the run: 'chief': 1")
    if chief != 1:
        raise ConfigurationError(f"roles['chief'] is {chief}: one chief coordinates the run, 'chief': 1")
    if not isinstance(np, int) or np == 0:
        raise ConfigurationError(f"np counts the workers with roles: a whole number of them, got {np!r}")
    refused = {"use_gpu": use_gpu, "min_np": min_np is not None}
    for name, given in refused.items():
        if given:
            raise ConfigurationError(
                f"{name} is not taken with roles yet (the chief and parameter servers would hold GPUs "
                f"or slots like workers): leave {name} out, or run without roles"
            )
    return Roles(workers=abs(np), ps=ps, chief=chief)


def reduction(comm: dict, np: int, min_np: Optional[int]) -> Optional[Roles]:
    """The roles of a run with ``comm={"reduction_servers": k}`` (None without): ``np`` workers,
    then ``k`` servers; refused with ``min_np`` (the servers' group is formed once)."""
    servers = comm.get("reduction_servers")
    if not servers:
        return None
    if min_np is not None:
        raise ConfigurationError(
            "min_np is not taken with comm={'reduction_servers': ...} yet (the workers' and servers' "
            "group is formed for a fixed number of workers): leave min_np out, or the servers"
        )
    return Roles(workers=abs(np), ps=0, chief=0, reducers=int(servers))


def refused_call(roles: Optional[Roles], return_all: bool, data: bool) -> Optional[ConfigurationError]:
    """Why a run with TensorFlow's roles takes no ``return_all`` or ``run_with_data``, and the fix
    (None: taken; with reduction servers the workers return and read the rows)."""
    if roles is None or not roles.chief or not (return_all or data):
        return None
    return ConfigurationError(
        "with roles the function runs on the chief only, and its tf.data pipeline (a "
        "DatasetCreator's dataset_fn, which TensorFlow runs on the workers) reads the data: "
        + ("leave return_all out (the chief's result is the run's)" if return_all else
           "use run(...) instead of run_with_data(...)")
    )  # fmt: skip


class StopServers:
    """Driver: the servers' tasks, told to stop once rank 0's function has returned.

    Each task's reply channel is known from its rank's rendezvous report (:meth:`reached`); rank
    0's report that its function returned (:meth:`done`) sends ``FRAME_STOP`` to all of them, and
    to any that reports after it.
    """

    def __init__(self) -> None:
        self._sends: Dict[int, Callable[[dict], None]] = {}
        self._stopping = False
        self._lock = threading.Lock()

    def reached(self, rank: Any, send: Optional[Callable[[dict], None]]) -> None:
        if send is None or not isinstance(rank, int) or rank == 0:
            return
        with self._lock:
            self._sends[rank] = send
            late = self._stopping
        if late:
            _stop(send)

    def done(self, rank: Any) -> None:
        if rank != 0:
            return
        with self._lock:
            self._stopping = True
            sends = list(self._sends.values())
        for send in sends:
            _stop(send)


def _stop(send: Callable[[dict], None]) -> None:
    try:
        send({"type": protocol.FRAME_STOP})
    except OSError:  # that task's connection is gone: its rank went with it
        pass
