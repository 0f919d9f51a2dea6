"""An ordinary torch.distributed DDP script: runs unchanged under torchrun or `sparkml-dist run`.

torchrun --nproc_per_node=2 examples/ddp_train.py --steps 20
sparkml-dist run --np 2 --master "local[2]" examples/ddp_train.py -- --steps 20
"""

import argparse

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(args.steps):
        X = torch.randn(64, 8, generator=g)
        loss = ((model(X).squeeze(1) - X.sum(1)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if dist.get_rank() == 0:
        print(f"final loss {loss.item():.4f} after {args.steps} steps on {dist.get_world_size()} ranks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
