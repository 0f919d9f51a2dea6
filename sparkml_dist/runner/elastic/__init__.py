"""Survivors keep running when a rank is lost: Horovod Elastic's API on torch.distributed.  [rank]

Inside a :class:`~sparkml_dist.runner.BarrierRunner` run with ``max_restarts >= 1`` and
``backend="torch"`` (gloo or NCCL), a function decorated with :func:`run` survives the loss of a
rank (rank 0 included) without a restart of the run:

* the task that lost the rank starts a new one in its place, from the warm pool when there is one
  (each task at most ``max_restarts`` times);
* the others' failed collective ("Connection reset by peer", ...) is caught by :func:`run`; they
  agree on the new membership through the run's store and form a new process group
  (:mod:`.membership`): ``torch.distributed``'s default group is the new one afterwards;
* every rank goes back to the last :meth:`TorchState.commit` (the step in flight is dropped), and
  the new rank receives that state from a live rank (:mod:`.state`), not from disk, then the
  decorated function is called again on every rank.

Rank 0's process serves the run's store: a new rank 0 serves a new one on the same socket, and the
others connect to it again. Losing an executor (Spark's barrier stage) restarts the run from the
latest checkpoint (``max_restarts``, ``checkpoint_dir``), as without ``elastic.run``, unless the
run has ``executor_loss="replace"`` (plain tasks: only the lost executor's ranks start again, and
the driver serves the store, :mod:`.executor_loss`); with ``min_np`` too, the world shrinks and
grows in place: the others go on as a smaller group when the lost ranks are not back within
``resize_wait``, and let them in at a commit when they come (:mod:`.membership`); the runner's
``shard()`` and loaders deal the rows to each new size (:mod:`sparkml_dist.runner.data.resize`).
A rank that raises restarts the run either way (a bug is not a lost rank). Horovod, TensorFlow and
JAX runs keep checkpoint restarts.

Example::

    from sparkml_dist.runner import BarrierRunner, elastic

    def main():
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state = elastic.TorchState(model=model, optimizer=opt, step=0)
        train(state)
        return state.model.state_dict()

    @elastic.run
    def train(state):
        ddp = torch.nn.parallel.DistributedDataParallel(state.model)  # built in every group
        while state.step < 100:
            ...  # forward, backward, state.optimizer.step() on the rows of step state.step
            state.step += 1
            state.commit()

    BarrierRunner(np=4, max_restarts=2).run(main)

The function runs again from the top after a loss: anything it builds from the group (a DDP
wrapper, a sampler's rank) is built again; what it resumes (the batch to read next) comes from the
state's counters.
"""

from __future__ import annotations

import functools
import os
from typing import Callable

from ...errors import ConfigurationError
from .. import backends, comm_settings, protocol, rank_channel
from ..data.shard import redeal as redeal_rows
from ..timing.clock import CLOCK
from . import membership
from .state import TorchState

__all__ = ["TorchState", "run"]


def _say(text: str) -> None:
    rank_channel.send_log(text)


def _entered() -> None:
    """Refuse where a lost rank cannot be replaced; tell the task that it can be."""
    name = os.environ.get(protocol.BACKEND_ENV)
    if rank_channel.CTRL is None or name is None:
        raise ConfigurationError(
            "elastic.run replaces lost ranks of a BarrierRunner run: call the function through "
            "BarrierRunner(np=..., max_restarts=1 or more).run(main)"
        )
    if not backends.get(name).torch_group:
        raise ConfigurationError(
            f"elastic.run keeps survivors running on backend='torch'; under backend={name!r} a lost "
            "rank restarts the run from its latest checkpoint (max_restarts, checkpoint_dir): "
            "call the function without @elastic.run"
        )
    if comm_settings.of_run().get("reduction_servers"):
        raise ConfigurationError(
            "elastic.run does not form the reduction servers' group again after a lost rank yet: with "
            "comm={'reduction_servers': ...} a lost rank restarts the run from its latest checkpoint "
            "(max_restarts, checkpoint_dir); call the function without @elastic.run, or leave the servers out"
        )


def _inside(inside: bool) -> None:
    """Tell the task whether a death of this process is a lost rank to replace: inside the
    function, yes; once it returned or raised (a bug, or a loss it could not survive), no."""
    rank_channel.send(protocol.EVENT_ELASTIC, inside=inside)


def lost_peer(exc: BaseException) -> bool:
    """A collective failed because a peer went away (not a bug of the function's own)."""
    import torch.distributed as dist

    if isinstance(exc, getattr(dist, "DistNetworkError", ())):
        return True
    text = str(exc)
    peer_lost = backends.get(os.environ.get(protocol.BACKEND_ENV, "torch")).peer_lost
    return isinstance(exc, RuntimeError) and any(p in text for p in peer_lost)


def run(func: Callable) -> Callable:
    """Decorate the training function ``func(state, *args, **kwargs)``: every rank first takes a
    live rank's state (:meth:`TorchState.sync`); when a peer is lost, the group is formed again,
    the state goes back to its last commit and ``func`` is called again (module docstring)."""

    @functools.wraps(func)
    def wrapper(state: TorchState, *args, **kwargs):
        _entered()
        _inside(True)
        try:
            return _survive(func, state, args, kwargs)
        finally:
            _inside(False)

    return wrapper


def _survive(func: Callable, state: TorchState, args: tuple, kwargs: dict):
    """Call ``func`` until it returns, forming the group again after each lost peer."""
    member = membership.current()
    fresh = membership.replaces() and member.generation >= 0  # a new rank, its state not yet sent
    while True:
        try:
            if member.min_np:  # a world that changed in place: the rows dealt to its ranks again
                redeal_rows(member.rank, member.world)
            root, commits = state.sync(fresh=fresh)
            if fresh:
                was = f" (started as rank {member.origin})" if member.rank != member.origin else ""
                _say(
                    f"[sparkml_dist] rank {member.rank}{was} rejoined at commit {commits} "
                    f"{_brief(state.counters())}, its state from rank {root} (generation {member.generation})"
                )
            fresh = False
            return func(state, *args, **kwargs)
        except Exception as exc:
            regrow = isinstance(exc, membership.Regrow)
            if not (regrow or lost_peer(exc)):
                raise
            CLOCK.abandon()  # the wait for the new group is nobody's step time
            _before(member, exc, regrow)
            before = member.world
            generation = member.reform()
            state.restore()
            if member.rank == 0:
                _say(_formed(member, generation, before, state))


def _brief(counters: dict) -> str:
    """The counters as a console line shows them: a long list or dict by its length only."""
    parts = []
    for name, value in counters.items():
        long = isinstance(value, (list, dict, tuple)) and len(value) > 6
        parts.append(f"{name!r}: " + (f"<{type(value).__name__} of {len(value)}>" if long else repr(value)))
    return "{" + ", ".join(parts) + "}"


def _before(member: membership.Membership, exc: BaseException, regrow: bool) -> None:
    """Rank 0's line before the group forms again: a lost rank, or ranks coming back."""
    if member.rank != 0:
        return
    if regrow:
        _say(f"[sparkml_dist] lost ranks came back: the next generation takes them in ({exc})")
        return
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    wait = f" (up to resize_wait={member.wait:.0f}s, then on with min_np={member.min_np} or more)"
    _say(
        f"[sparkml_dist] a rank was lost ({first}): the others wait for its replacement"
        + (wait if member.min_np else "")
    )


def _formed(member: membership.Membership, generation: int, before: int, state: TorchState) -> str:
    """Rank 0's line once a generation formed: its size (fewer or more ranks than before, with
    ``min_np``) and the commit every rank went back to."""
    back = f"back to commit {state.commits} {_brief(state.counters())}"
    if member.world < member.full:
        return (
            f"[sparkml_dist] generation {generation}: {member.world} of {member.full} ranks "
            f"(min_np={member.min_np}), the run goes on without the lost ranks, {back}"
        )
    grown = " (grown back)" if member.world > before else " again"
    return f"[sparkml_dist] generation {generation}: {member.world} ranks{grown}, {back}"
