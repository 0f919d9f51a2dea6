"""Sharded data parallelism (FSDP2) through BarrierRunner: nothing from sparkml_dist is needed.

sparkml-dist run --np 2 --master "local[2]" examples/fsdp_train.py -- --steps 30
torchrun --nproc_per_node=2 examples/fsdp_train.py

Each rank holds 1/world of every parameter, gradient and Adam state (``fully_shard`` on each
block, then on the whole model); the full weights exist only while a block computes.  Rank 0
gathers the whole state dict at the end.
"""

import argparse

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--width", type=int, default=256)
    args = p.parse_args()
    use_gpu = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_gpu else "gloo")
    mesh = init_device_mesh("cuda" if use_gpu else "cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    w = args.width
    blocks = [torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.GELU()) for _ in range(8)]
    model = torch.nn.Sequential(*blocks, torch.nn.Linear(w, 1))
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())  # each rank its own data
    for _ in range(args.steps):
        X = torch.randn(64, w, generator=g)
        loss = torch.nn.functional.mse_loss(model(X), torch.sin(X[:, :4].sum(1, keepdim=True)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        held = sum(p.to_local().numel() for p in model.parameters())
        print(f"final loss {loss.item():.4f}; rank 0 holds {held} of {sum(v.numel() for v in full.values())} "
              f"parameters")  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
