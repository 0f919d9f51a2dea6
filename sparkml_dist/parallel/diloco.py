"""The parameter-server style as it is done now: local SGD / DiLoCo, no parameter server.  [rank]

Runs inside a function given to :class:`~sparkml_dist.runner.BarrierRunner` (or any
``torch.distributed`` job).  Every rank trains its own copy of the model with its own (inner)
optimizer for ``sync_every`` = H steps, with no communication; then the ranks average how far
their parameters moved since the last synchronization (one all-reduce of the parameters, not of
every step's gradients: about H times fewer bytes) and every rank applies that average change
with the same *outer* optimizer (SGD with Nesterov momentum, as DiLoCo; Douillard et al., 2023).
After each outer step the ranks hold identical parameters. Before the first, every rank is
checked to hold the same parameter shapes and the same settings (``sync_every``, the outer
optimizer's), refused naming both ranks' values (:mod:`.agreement`).  With H=1, an outer SGD of lr 1 and no
momentum this is plain data-parallel SGD (tested).  ``torch.distributed.rpc`` (the old parameter
server's transport) is being retired by PyTorch and is not used.

:meth:`DiLoCo.state_dict` holds the outer state (the anchor parameters, the outer optimizer's
momentum, the step count) for ``checkpoint.save``; with the model's and the inner optimizer's state
a run resumes exactly.

Example::

    from sparkml_dist.parallel.diloco import DiLoCo

    def train():
        init_process_group()
        model = make_net()                      # not wrapped in DDP: the ranks drift, then meet
        inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
        outer = DiLoCo(model, sync_every=8)     # outer SGD lr 0.7, Nesterov momentum 0.9
        for x, y in batches:
            loss_fn(model(x), y).backward()
            inner.step(); inner.zero_grad()
            outer.step()                        # every 8th call: all-reduce + outer step
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch
import torch.distributed as dist

from ..errors import ConfigurationError
from .agreement import check_alike, check_same

__all__ = ["DiLoCo"]


class DiLoCo:
    """Local SGD with an outer optimizer over the averaged parameter change (see module docstring).

    Args:
        model: the module every rank trains (its parameters are made equal to rank 0's now).
        sync_every: H, inner steps between synchronizations.
        outer_lr, outer_momentum, nesterov: the outer SGD (DiLoCo's 0.7, 0.9, Nesterov).
        process_group: the group to average over (default: the world).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        sync_every: int = 8,
        outer_lr: float = 0.7,
        outer_momentum: float = 0.9,
        nesterov: bool = True,
        process_group=None,
    ) -> None:
        if not dist.is_initialized():
            raise ConfigurationError(
                "DiLoCo: torch.distributed is not initialized: call "
                "sparkml_dist.runner.init_process_group() first"
            )
        if not isinstance(sync_every, int) or isinstance(sync_every, bool) or sync_every < 1:
            raise ConfigurationError(f"DiLoCo: sync_every must be a positive integer, got {sync_every!r}")
        if nesterov and not outer_momentum:
            raise ConfigurationError("DiLoCo: nesterov=True needs outer_momentum > 0 (or nesterov=False)")
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        # before anything is averaged: the same parameters and settings on every rank (a
        # Linear(4, 3) here and a Linear(4, 5) there would otherwise be broadcast into each other)
        check_alike([p for _, p in named], "DiLoCo", [n for n, _ in named], process_group)
        check_same(
            {
                "sync_every": sync_every,
                "outer_lr": outer_lr,
                "outer_momentum": outer_momentum,
                "nesterov": nesterov,
            },
            "DiLoCo",
            process_group,
        )
        self.params: List[torch.nn.Parameter] = [p for _, p in named]
        self.sync_every, self.group, self.steps, self.syncs = sync_every, process_group, 0, 0
        self.bytes_reduced = 0
        with torch.no_grad():
            for p in self.params:  # every rank starts from rank 0's parameters
                dist.broadcast(
                    p.data, dist.get_global_rank(process_group, 0) if process_group else 0, process_group
                )
        self.anchor = [p.detach().clone() for p in self.params]
        self.outer = torch.optim.SGD(self.anchor, lr=outer_lr, momentum=outer_momentum, nesterov=nesterov)

    def step(self) -> bool:
        """Call after every inner optimizer step; on every ``sync_every``-th, average the change
        and take the outer step (True then)."""
        self.steps += 1
        if self.steps % self.sync_every:
            return False
        world = dist.get_world_size(self.group)
        with torch.no_grad():
            deltas = [a - p.detach() for a, p in zip(self.anchor, self.params)]  # the outer gradient
            flat = torch.cat([d.reshape(-1) for d in deltas])
            dist.all_reduce(flat, group=self.group)
            flat /= world
            self.bytes_reduced += flat.numel() * flat.element_size()
            offset = 0
            for a, d in zip(self.anchor, deltas):
                a.grad = flat[offset : offset + d.numel()].view_as(d).clone()
                offset += d.numel()
        self.outer.step()
        self.outer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for a, p in zip(self.anchor, self.params):
                p.copy_(a)
        self.syncs += 1
        return True

    def state_dict(self) -> Dict[str, Any]:
        """The outer state: anchor parameters, outer optimizer, step count."""
        return {
            "anchor": [a.clone() for a in self.anchor],
            "outer": self.outer.state_dict(),
            "steps": self.steps,
            "syncs": self.syncs,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if len(state["anchor"]) != len(self.anchor):
            raise ConfigurationError(
                f"DiLoCo.load_state_dict: the state holds {len(state['anchor'])} parameters, this model "
                f"{len(self.anchor)}: load the state saved for this model"
            )
        with torch.no_grad():
            for a, saved in zip(self.anchor, state["anchor"]):
                a.copy_(saved)
        self.outer.load_state_dict(state["outer"])
        self.steps, self.syncs = int(state["steps"]), int(state["syncs"])
