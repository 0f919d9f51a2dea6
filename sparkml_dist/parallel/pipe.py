"""``pipeline()``: one model split into stages over the ranks.  [rank process]

Built on ``torch.distributed.pipelining`` (``PipelineStage`` and its schedules) and a 2-D
``DeviceMesh`` (``dp`` x ``pp``); this module only chooses the split, wires the stages and keeps
the bookkeeping (losses, replica gradients, gathered state dicts).

Layout: ``world = pp_ranks x data_parallel``; global rank ``r`` is replica ``r // pp_ranks`` and
pipeline rank ``r % pp_ranks``; stage ``s`` lives on pipeline rank ``s % pp_ranks`` (a rank holds
``stages / pp_ranks`` stages, looped, as interleaved schedules expect).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from ..errors import CollectionError, ConfigurationError
from . import costs as _costs
from .blocks import Blocks, blocks_of, check_forward, on_meta, stage_examples
from .split import check_counts, partition, ranges, stage_sums
from .transfer import recv_tree, send_tree

SCHEDULE_NAMES = ("simple", "interleaved")
BALANCE_NAMES = ("compute", "memory")


@dataclass(frozen=True)
class Layout:
    """Who holds what: replicas x pipeline ranks, and the stages of this rank."""

    world: int
    rank: int
    replicas: int
    pp_ranks: int
    stages: int

    @property
    def replica(self) -> int:
        return self.rank // self.pp_ranks

    @property
    def pp_rank(self) -> int:
        return self.rank % self.pp_ranks

    @property
    def local_stages(self) -> List[int]:
        return list(range(self.pp_rank, self.stages, self.pp_ranks))

    def global_rank(self, replica: int, pp_rank: int) -> int:
        return replica * self.pp_ranks + pp_rank


def _int(name: str, value: Any, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigurationError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _world() -> Tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        return int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    raise ConfigurationError(
        "pipeline() runs on every rank of a distributed job: call it inside a function run by "
        "BarrierRunner (or under torchrun), where RANK and WORLD_SIZE are set"
    )


def check_layout(
    *, blocks: Blocks, stages, microbatches, example_input, schedule, balance, data_parallel
) -> Layout:
    """Every argument checked before any collective: a ConfigurationError names the parameter."""
    stages = _int("stages", stages)
    microbatches = _int("microbatches", microbatches)
    data_parallel = _int("data_parallel", data_parallel)
    if schedule not in SCHEDULE_NAMES:
        raise ConfigurationError(f"schedule must be one of {SCHEDULE_NAMES}, got {schedule!r}")
    if isinstance(balance, str):
        if balance not in BALANCE_NAMES:
            raise ConfigurationError(
                f"balance must be one of {BALANCE_NAMES} or a list of layer counts, got {balance!r}"
            )
    else:
        check_counts(balance, stages, len(blocks))
    if not isinstance(example_input, torch.Tensor) or example_input.dim() < 1:
        raise ConfigurationError("example_input must be a tensor shaped like one mini-batch (batch, ...)")
    batch = example_input.shape[0]
    if batch % microbatches:
        raise ConfigurationError(
            f"microbatches={microbatches} must divide the mini-batch ({batch} rows in example_input): "
            "every micro-batch has the same size"
        )
    if stages > len(blocks):
        raise ConfigurationError(f"stages={stages} is more than the model's {len(blocks)} layers")
    world, rank = _world()
    if world % data_parallel:
        raise ConfigurationError(f"data_parallel={data_parallel} must divide the world size ({world} ranks)")
    pp = world // data_parallel
    if stages % pp:
        raise ConfigurationError(
            f"stages={stages} must be a multiple of the pipeline ranks: world size {world} / "
            f"data_parallel {data_parallel} = {pp} (one stage per rank: stages={pp}; "
            f"interleaved: {2 * pp}, {3 * pp}, ...)"
        )
    per_rank = stages // pp
    if schedule == "interleaved" and per_rank == 1 and microbatches < stages:
        raise ConfigurationError(
            f"microbatches={microbatches} must be >= stages ({stages}) for the 1F1B schedule"
        )
    if schedule == "interleaved" and per_rank > 1 and microbatches % max(1, microbatches // pp):
        raise ConfigurationError(
            f"microbatches={microbatches}: interleaved 1F1B needs a multiple of {max(1, microbatches // pp)} "
            f"here (microbatches < {pp} pipeline ranks or a multiple of it work)"
        )
    return Layout(world, rank, data_parallel, pp, stages)


def _ensure_process_group() -> None:
    if dist.is_initialized():
        return
    from ..runner import protocol
    from ..runner.context import init_process_group

    if protocol.RUN_ENV in os.environ:
        init_process_group()
    else:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")


def _default_device() -> torch.device:
    from ..runner import protocol

    if protocol.RUN_ENV in os.environ:
        from ..runner.context import context

        return torch.device(context().device)
    return torch.device("cpu")


def _choose_split(blocks, balance, layout, micro, microbatches, device) -> Tuple[List[int], List[float]]:
    """Rank 0 measures and cuts; every rank receives the same counts and per-stage costs."""
    n_stages = layout.stages
    packed = torch.zeros(2 * n_stages, dtype=torch.float64, device=device)
    if layout.rank == 0:
        if isinstance(balance, str):
            measure = _costs.compute_costs if balance == "compute" else None
            costs = (
                measure(blocks, micro, device)
                if measure
                else _costs.memory_costs(blocks, micro, microbatches)
            )
            counts = partition(costs, n_stages)
        else:
            counts, costs = list(balance), [1.0] * len(blocks)
        packed[:n_stages] = torch.tensor(counts, dtype=torch.float64)
        packed[n_stages:] = torch.tensor(stage_sums(costs, counts), dtype=torch.float64)
    dist.broadcast(packed, src=0)
    packed = packed.cpu()
    return [int(c) for c in packed[:n_stages]], [float(c) for c in packed[n_stages:]]


def _describe(layout: Layout, spans, costs, balance, schedule) -> str:
    unit = {"compute": "ms", "memory": "MiB"}.get(balance if isinstance(balance, str) else "", "layers")
    scale = {"ms": 1e3, "MiB": 1 / 2**20, "layers": 1.0}[unit]
    per_rank = layout.stages // layout.pp_ranks
    kind = {
        ("simple", False): "GPipe",
        ("simple", True): "looped GPipe",
        ("interleaved", False): "1F1B",
        ("interleaved", True): "interleaved 1F1B",
    }[(schedule, per_rank > 1)]
    parts = ", ".join(
        f"stage {s} layers {a}-{b - 1} ({c * scale:.3g} {unit})"
        for s, ((a, b), c) in enumerate(zip(spans, costs))
    )
    return (
        f"pipeline: {spans[-1][1]} layers in {layout.stages} stages on {layout.pp_ranks} rank(s) x "
        f"{layout.replicas} replica(s), {kind}, balance "
        f"{balance if isinstance(balance, str) else 'given'}: {parts}"
    )


def _materialise(block: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    if not on_meta(block):
        return block.to(device)
    block = block.to_empty(device=device)
    for m in block.modules():
        if callable(getattr(m, "reset_parameters", None)):
            m.reset_parameters()
    return block


class _EvalMode:
    """Blocks in eval mode for a while (shape and cost probes must not move BatchNorm statistics)."""

    def __init__(self, modules):
        self.modules = list(modules)

    def __enter__(self):
        self.modes = [m.training for m in self.modules]
        for m in self.modules:
            m.eval()

    def __exit__(self, *exc):
        for m, mode in zip(self.modules, self.modes):
            m.train(mode)


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
    _ensure_process_group()
    device = torch.device(device) if device is not None else _default_device()
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (layout.replicas, layout.pp_ranks), mesh_dim_names=("dp", "pp"))
    micro = example_input[: example_input.shape[0] // microbatches]
    meta = on_meta(model)
    with _EvalMode(blocks.modules):
        check_forward(model, blocks, micro)
        counts, stage_costs = _choose_split(blocks, balance, layout, micro, microbatches, device)
        spans = ranges(counts)
        examples, final = stage_examples(
            blocks, spans, micro.to("meta") if meta else micro, layout.local_stages
        )
    if layout.rank == 0:
        from ..runner.context import log_to_driver

        log_to_driver(_describe(layout, spans, stage_costs, balance, schedule))
    full_keys = list(model.state_dict(keep_vars=True).keys())
    return Pipeline(
        blocks,
        layout,
        mesh,
        spans,
        stage_costs,
        examples,
        final,
        full_keys,
        device,
        schedule=schedule,
        loss_fn=loss_fn,
        microbatches=microbatches,
        batch=example_input.shape,
    )


class Pipeline:
    """A model split into pipeline stages; built by :func:`pipeline` on every rank.

    Attributes: ``split`` (the ``(first, end)`` layer range of every stage, end exclusive; the
    same on every rank), ``stage_costs`` (the cost of each stage under the chosen balance),
    ``replica`` / ``replicas`` (this rank's data-parallel replica and their number), ``stages_here``
    (the stages this rank runs).
    """

    def __init__(
        self,
        blocks,
        layout,
        mesh,
        spans,
        stage_costs,
        examples,
        final,
        full_keys,
        device,
        *,
        schedule,
        loss_fn,
        microbatches,
        batch,
    ):
        self.split: List[Tuple[int, int]] = list(spans)
        self.stage_costs = list(stage_costs)
        self.replica, self.replicas = layout.replica, layout.replicas
        self.stages_here = layout.local_stages
        self._layout, self._mesh, self._device = layout, mesh, device
        self._batch, self._full_keys = tuple(batch), full_keys
        self._pp_group, self._dp_group = mesh.get_group("pp"), mesh.get_group("dp")
        local = [i for s in self.stages_here for i in range(*spans[s])]
        for i in local:
            _materialise(blocks.modules[i], device)
        self._local = blocks.container(local)  # the original model's layout, this rank's blocks only
        self._stage_modules = {s: blocks.container(range(*spans[s])) for s in self.stages_here}
        self._examples, self._final = examples, final
        self._microbatches = microbatches
        self._schedule = self._make_schedule(schedule, loss_fn)
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

        Every rank of a replica passes the same mini-batch.  Call ``optimizer.zero_grad()`` before
        and ``optimizer.step()`` after, as in single-process training.
        """
        self._check_batch(inputs, "inputs")
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

    def _share(self, t: torch.Tensor) -> torch.Tensor:
        """The last stage's tensor on every rank of the replica (then averaged over replicas)."""
        lay = self._layout
        dist.broadcast(t, src=lay.global_rank(lay.replica, lay.pp_ranks - 1), group=self._pp_group)
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
        return self._share_output(out.contiguous())[:rows].cpu()

    def _share_output(self, out: torch.Tensor) -> torch.Tensor:
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
        pieces = [_to_cpu(tree)] + [
            recv_tree(lay.global_rank(0, p), self._device) for p in range(1, lay.pp_ranks)
        ]
        merged = {}
        model = {k: v for piece in pieces for k, v in piece["model"].items()}
        merged["model"] = OrderedDict((k, model[k]) for k in self._full_keys if k in model)
        if "optimizer" in tree:
            merged["optimizer"] = {
                "state": {k: v for piece in pieces for k, v in piece["optimizer"]["state"].items()},
                "param_groups": [g for piece in pieces for g in piece["optimizer"]["param_groups"]],
            }
        return merged

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
        osd = state["optimizer"]
        own = {
            "state": {k: v for k, v in osd["state"].items() if k in names},
            "param_groups": [
                dict(g, params=[p for p in g["params"] if p in names])
                for g in osd["param_groups"]
                if any(p in names for p in g["params"])
            ],
        }
        set_optimizer_state_dict(self._local, optimizer, own)


def _to_cpu(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu().clone()
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_to_cpu(v) for v in tree]
    return tree
