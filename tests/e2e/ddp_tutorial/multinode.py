"""A torchrun-style script that imports its sibling module (the layout of PyTorch's DDP tutorial
series' multinode.py): unchanged, it must run under `sparkml-dist run` as under torchrun."""

import argparse
import os

import torch
import torch.distributed as dist
from datautils import MyTrainDataset
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def main(epochs, batch_size):
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    data = MyTrainDataset(256)
    loader = DataLoader(data, batch_size=batch_size, sampler=DistributedSampler(data))
    model = DDP(torch.nn.Linear(20, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    import datautils

    words = open(os.path.join("vocab", "words.txt")).read().split()  # from --archives
    import extra_lib  # from --py-files

    print(
        f"rank {rank} trained {epochs} epochs; datautils from {os.path.dirname(datautils.__file__)}; "
        f"vocab {words}; extra {extra_lib.VALUE}; cwd {os.getcwd()}"
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("--batch_size", type=int, default=32)
    args = parser.parse_args()
    main(args.total_epochs, args.batch_size)
