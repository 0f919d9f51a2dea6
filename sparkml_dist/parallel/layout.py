"""The shape of a pipeline job: replicas x pipeline ranks, stages per rank; arguments checked.  [rank]

Every check here runs before any process group or collective exists, so a bad
argument is a ConfigurationError naming the parameter on every rank, never a hang.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, List, Tuple

import torch
import torch.distributed as dist

from .. import arg_checks
from ..errors import ConfigurationError
from ..stages import check_counts
from .blocks import Blocks

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
    return arg_checks.integer(name, value, minimum)


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
