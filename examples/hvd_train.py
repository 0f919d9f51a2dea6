"""An ordinary Horovod script: runs unchanged under horovodrun or `sparkml-dist run --backend horovod`.

horovodrun -np 2 python examples/hvd_train.py --steps 20
sparkml-dist run --backend horovod --np 2 --master "local[2]" examples/hvd_train.py -- --steps 20
"""

import argparse

import horovod.torch as hvd
import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(hvd.rank())
    for _ in range(args.steps):
        X = torch.randn(64, 8, generator=g)
        loss = ((model(X).squeeze(1) - X.sum(1)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    loss = hvd.allreduce(loss.detach(), name="final_loss")  # the mean over the ranks
    if hvd.rank() == 0:
        print(f"final loss {loss.item():.4f} after {args.steps} steps on {hvd.size()} ranks")


if __name__ == "__main__":
    main()
