"""``pipeline()``: one model split into stages over the ranks.  [rank]

Built on ``torch.distributed.pipelining`` (``PipelineStage`` and its schedules) and a 2-D
``DeviceMesh`` (``dp`` x ``pp``); this module only chooses the split, wires the stages and keeps
the bookkeeping (losses, replica gradients, gathered state dicts).

Layout: ``world = pp_ranks x data_parallel``; global rank ``r`` is replica ``r // pp_ranks`` and
pipeline rank ``r % pp_ranks``; stage ``s`` lives on pipeline rank ``s % pp_ranks`` (a rank holds
``stages / pp_ranks`` stages, looped, as interleaved schedules expect).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from ..errors import CollectionError, ConfigurationError
from ..stages import ranges
from . import wiring
from .blocks import blocks_of, check_forward, container, on_meta, stage_examples
from .layout import check_layout
from .transfer import merge_pieces, optimizer_part, recv_tree, send_tree, to_cpu


def pipeline(
    model: torch.nn.Module,
    *,
    stages: int,
    microbatches: int,
    loss_fn: Callable,
    example_input: torch.Tensor,
    schedule: str = "interleaved",
    balance: Union[str, Sequence[int]] = "compute",
    data_parallel: int = 1,
    device: Optional[Union[str, torch.device]] = None,
) -> "Pipeline":
    """Split ``model`` into ``stages`` over the ranks; see :mod:`sparkml_dist.parallel`."""
    blocks = blocks_of(model)
    layout = check_layout(
        blocks=blocks,
        stages=stages,
        microbatches=microbatches,
        example_input=example_input,
        schedule=schedule,
        balance=balance,
        data_parallel=data_parallel,
    )
    wiring.ensure_process_group()
    device = torch.device(device) if device is not None else wiring.default_device()
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (layout.replicas, layout.pp_ranks), mesh_dim_names=("dp", "pp"))
    micro = example_input[: example_input.shape[0] // microbatches]
    meta = on_meta(model)
    with wiring.EvalMode(blocks.modules):
        check_forward(model, blocks, micro)
        counts, stage_costs = wiring.choose_split(blocks, balance, layout, micro, microbatches, device)
        spans = ranges(counts)
        examples, final = stage_examples(
            blocks, spans, micro.to("meta") if meta else micro, layout.local_stages
        )
    if layout.rank == 0:
        from ..runner.context import log_to_driver

        log_to_driver(wiring.describe(layout, spans, stage_costs, balance, schedule))
    return Pipeline(
        _Plan(
            blocks=blocks,
            layout=layout,
            mesh=mesh,
            spans=spans,
            stage_costs=stage_costs,
            examples=examples,
            final=final,
            full_keys=list(model.state_dict(keep_vars=True).keys()),
            device=device,
            schedule=schedule,
            loss_fn=loss_fn,
            microbatches=microbatches,
            batch=tuple(example_input.shape),
        )
    )


@dataclass
class _Plan:
    """What :func:`pipeline` checked, agreed on and measured, for :class:`Pipeline` to build on."""

    blocks: Any  # blocks.Blocks
    layout: Any  # layout.Layout
    mesh: Any  # the (dp, pp) DeviceMesh
    spans: List[Tuple[int, int]]  # every stage's layer range
    stage_costs: List[float]
    examples: Dict[int, Tuple[torch.Tensor, torch.Tensor]]  # this rank's stages' (input, output), meta
    final: torch.Tensor  # the model's output for one micro-batch, meta
    full_keys: List[str]  # the unsplit model's state dict keys, in order
    device: torch.device
    schedule: str
    loss_fn: Callable
    microbatches: int
    batch: Tuple[int, ...]  # example_input's shape


class Pipeline:
    """A model split into pipeline stages; built by :func:`pipeline` on every rank.

    Attributes: ``split`` (the ``(first, end)`` layer range of every stage, end exclusive; the
    same on every rank), ``stage_costs`` (the cost of each stage under the chosen balance),
    ``replica`` / ``replicas`` (this rank's data-parallel replica and their number), ``stages_here``
    (the stages this rank runs).
    """

    def __init__(self, plan: _Plan):
        layout, spans, blocks = plan.layout, plan.spans, plan.blocks
        self.split: List[Tuple[int, int]] = list(spans)
        self.stage_costs = list(plan.stage_costs)
        self.replica, self.replicas = layout.replica, layout.replicas
        self.stages_here = layout.local_stages
        self._layout, self._mesh, self._device = layout, plan.mesh, plan.device
        self._batch, self._full_keys = plan.batch, plan.full_keys
        self._pp_group, self._dp_group = plan.mesh.get_group("pp"), plan.mesh.get_group("dp")
        local = [i for s in self.stages_here for i in range(*spans[s])]
        for i in local:
            wiring.materialise(blocks.modules[i], plan.device)
        self._local = container(blocks, local)  # the original model's layout, this rank's blocks only
        if self.replicas > 1:  # replicas start equal, as DDP makes them (a meta model's init differs)
            src = layout.global_rank(0, layout.pp_rank)
            with torch.no_grad():
                for t in self._local.state_dict().values():
                    dist.broadcast(t, src=src, group=self._dp_group)
        self._stage_modules = {s: container(blocks, range(*spans[s])) for s in self.stages_here}
        self._examples, self._final = plan.examples, plan.final
        self._microbatches = plan.microbatches
        self._schedule = self._make_schedule(plan.schedule, plan.loss_fn)
        self._forward_schedule = None  # built on the first predict()
        self._first = 0 in self.stages_here
        self._last = layout.stages - 1 in self.stages_here

    def _make_schedule(self, schedule: str, loss_fn: Optional[Callable]):
        """torch's schedule over this rank's stages (static shapes: no metadata exchange)."""
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
            ScheduleLoopedBFS,
        )

        pipe_stages = []
        for s in self.stages_here:
            x, y = self._examples[s]
            pipe_stages.append(
                PipelineStage(
                    self._stage_modules[s],
                    s,
                    self._layout.stages,
                    self._device,
                    input_args=x.requires_grad_(s > 0 and x.is_floating_point()),
                    output_args=y.requires_grad_(y.is_floating_point()),
                    group=self._pp_group,
                )
            )
        looped = len(pipe_stages) > 1
        cls = {
            ("simple", False): ScheduleGPipe,
            ("simple", True): ScheduleLoopedBFS,
            ("interleaved", False): Schedule1F1B,
            ("interleaved", True): ScheduleInterleaved1F1B,
        }[(schedule, looped)]
        return cls(pipe_stages if looped else pipe_stages[0], self._microbatches, loss_fn=loss_fn)

    # ------------------------------------------------------------------ training
    def parameters(self):
        """This rank's parameters (its stages'), for its optimizer."""
        return self._local.parameters()

    def named_parameters(self):
        """This rank's parameters under their names in the unsplit model."""
        return self._local.named_parameters()

    def _check_batch(self, t: torch.Tensor, name: str) -> None:
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != self._batch:
            raise ConfigurationError(
                f"{name}: step() takes mini-batches shaped like example_input {self._batch}, got "
                f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__} (drop the "
                "last, smaller batch: drop_last=True)"
            )

    def step(self, inputs: torch.Tensor, target: torch.Tensor) -> float:
        """One training step on the mini-batch: gradients of its mean loss; that loss on every rank.

        Every rank of a replica passes the same mini-batch (checked: a digest of ``inputs`` and
        ``target`` is compared over the replica's ranks, and a mismatch is refused before anything
        is computed).  Call ``optimizer.zero_grad()`` before and ``optimizer.step()`` after, as in
        single-process training.
        """
        self._check_batch(inputs, "inputs")
        self._check_same_batch(inputs, target)
        self._local.train()
        args = (inputs.to(self._device),) if self._first else ()
        losses: List[torch.Tensor] = []
        kwargs: Dict[str, Any] = {"return_outputs": False}
        if self._last:
            kwargs.update(target=target.to(self._device), losses=losses)
        self._schedule.step(*args, **kwargs)
        if self.replicas > 1:
            self._average_gradients()
        if self._last:
            loss = torch.stack([v.detach().float() for v in losses]).mean()
        else:
            loss = torch.zeros((), device=self._device)
        return self._share(loss).item()

    def _check_same_batch(self, inputs: torch.Tensor, target: torch.Tensor) -> None:
        """Refuse a step whose ranks of one replica were given different batches: the first stage
        would train on one rank's inputs and the last stage score another rank's targets."""
        if self._layout.pp_ranks < 2:
            return
        mine = torch.cat([_digest(inputs), _digest(target)]).to(self._device)
        every = [torch.empty_like(mine) for _ in range(self._layout.pp_ranks)]
        dist.all_gather(every, mine, group=self._pp_group)
        if not all(torch.allclose(d, every[0], rtol=1e-6, atol=1e-9) for d in every[1:]):
            raise ConfigurationError(
                f"the ranks of a pipeline replica must be given the same batch, but the "
                f"{self._layout.pp_ranks} ranks of replica {self.replica} were given different ones. "
                "Feed a pipeline from a DataFrame with BarrierRunner.run_with_data(df, fn, "
                "replicas=data_parallel) (every rank of a replica then reads the same rows in the "
                "same order from shard()), or give every rank the same tensors."
            )

    def _share(self, t: torch.Tensor) -> torch.Tensor:
        """The last stage's tensor on every rank of the replica (then averaged over replicas)."""
        self._from_last_stage(t)
        if self.replicas > 1 and t.is_floating_point():
            dist.all_reduce(t, group=self._dp_group)
            t /= self.replicas
        return t

    def _average_gradients(self) -> None:
        grads = [p.grad for p in self._local.parameters() if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self._dp_group)
        flat /= self.replicas
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    # ------------------------------------------------------------------ inference
    @torch.no_grad()
    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        """The model's output for ``inputs`` (any number of rows), on every rank of the replica."""
        if not isinstance(inputs, torch.Tensor) or tuple(inputs.shape[1:]) != self._batch[1:]:
            raise ConfigurationError(f"inputs must be rows shaped like example_input's {self._batch[1:]}")
        was = self._local.training
        self._local.eval()
        try:
            return torch.cat([self._forward(c) for c in inputs.split(self._batch[0])])
        finally:
            self._local.train(was)

    def _forward(self, chunk: torch.Tensor) -> torch.Tensor:
        rows = chunk.shape[0]
        if rows < self._batch[0]:  # the schedule runs fixed-size micro-batches: pad, then drop
            chunk = torch.cat([chunk, chunk.new_zeros((self._batch[0] - rows, *chunk.shape[1:]))])
        args = (chunk.to(self._device),) if self._first else ()
        if self._forward_schedule is None:
            self._forward_schedule = self._make_schedule("simple", None)
        out = self._forward_schedule.step(*args)
        shape = (self._batch[0], *self._final.shape[1:])
        if not self._last:
            out = torch.empty(shape, dtype=self._final.dtype, device=self._device)
        return self._from_last_stage(out.contiguous())[:rows].cpu()

    def _from_last_stage(self, out: torch.Tensor) -> torch.Tensor:
        """``out`` as the replica's last stage holds it, on every rank of the replica."""
        lay = self._layout
        dist.broadcast(out, src=lay.global_rank(lay.replica, lay.pp_ranks - 1), group=self._pp_group)
        return out

    # ------------------------------------------------------------------ state
    def full_state_dict(self) -> Optional["OrderedDict[str, torch.Tensor]"]:
        """The whole model's state dict (the unsplit model's keys, CPU tensors) on rank 0, else None."""
        state = self._gather({"model": self._local.state_dict()})
        return None if state is None else state["model"]

    def state_dict(self, optimizer: Optional[torch.optim.Optimizer] = None) -> Optional[dict]:
        """``{"model": full state dict, "optimizer": every stage's optimizer state}`` on rank 0.

        For :func:`sparkml_dist.runner.checkpoint.save` (which writes on rank 0); optimizer state is
        keyed by parameter name, so :meth:`load_state_dict` gives each rank its own part back.
        """
        tree = {"model": self._local.state_dict()}
        if optimizer is not None:
            from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

            tree["optimizer"] = get_optimizer_state_dict(self._local, optimizer)
        return self._gather(tree)

    def _gather(self, tree: dict) -> Optional[dict]:
        """Replica 0's pieces merged on rank 0 (the other replicas hold the same weights)."""
        lay = self._layout
        if lay.replica != 0:
            return None
        if lay.pp_rank != 0:
            send_tree(tree, lay.global_rank(0, 0), self._device)
            return None
        pieces = [to_cpu(tree)] + [
            recv_tree(lay.global_rank(0, p), self._device) for p in range(1, lay.pp_ranks)
        ]
        return merge_pieces(pieces, self._full_keys)

    def load_state_dict(self, state: dict, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        """Load what :meth:`state_dict` (or :meth:`full_state_dict`) gave, on every rank.

        Each rank takes its own blocks' weights (and, with ``optimizer``, its parameters' state).
        """
        bundle = isinstance(state, dict) and isinstance(state.get("model"), dict)
        model_state = state["model"] if bundle else state
        mine = self._local.state_dict()
        missing = [k for k in mine if k not in model_state]
        if missing:
            raise CollectionError(
                f"the state has no {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}: it is "
                "not a state dict of this model"
            )
        self._local.load_state_dict({k: model_state[k] for k in mine})
        if optimizer is None:
            return
        if not bundle or "optimizer" not in state:
            raise ConfigurationError(
                "optimizer: the state holds no optimizer state (save pipe.state_dict(optimizer))"
            )
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        names = {n for n, _ in self._local.named_parameters()}
        set_optimizer_state_dict(self._local, optimizer, optimizer_part(state["optimizer"], names))


def _digest(t: torch.Tensor) -> torch.Tensor:
    """Two numbers that differ for different batches (their sum, and a sum weighted by position),
    computed in float64 on the CPU whatever the device."""
    flat = t.detach().reshape(-1).to("cpu", torch.float64)
    return torch.stack([flat.sum(), (flat * torch.arange(1, flat.numel() + 1, dtype=torch.float64)).sum()])
