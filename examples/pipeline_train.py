"""A deep MLP split into pipeline stages: runs under `sparkml-dist run` (or torchrun) unchanged.

sparkml-dist run --np 2 --master "local[2]" examples/pipeline_train.py -- --steps 60
torchrun --nproc_per_node=2 examples/pipeline_train.py --schedule simple --balance memory

Every rank builds the model and draws the same mini-batches (seeded by step); pipeline() keeps
each rank's stages only.  With --data-parallel 2 on 4 ranks, two pipelines train side by side,
each on its half of every mini-batch.
"""

import argparse

import torch

from sparkml_dist.parallel import pipeline


class Block(torch.nn.Module):
    """A residual MLP block (as in a transformer): deep stacks of them train well."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.fc1, self.fc2 = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


def teacher_batch(step: int, rows: int, width: int):
    g = torch.Generator().manual_seed(step)
    X = torch.randn(rows, width, generator=g)
    return X, X[:, :4].sum(1, keepdim=True) / 2  # a target a deep MLP fits in a few dozen steps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--schedule", default="interleaved", choices=["simple", "interleaved"])
    p.add_argument("--balance", default="compute", choices=["compute", "memory"])
    p.add_argument("--data-parallel", type=int, default=1)
    args = p.parse_args()

    torch.manual_seed(0)
    w = args.width
    blocks = [Block(w) for _ in range(args.layers - 1)]
    model = torch.nn.Sequential(*blocks, torch.nn.Linear(w, 1))
    rows = args.batch // args.data_parallel
    pipe = pipeline(
        model,
        stages=args.stages,
        microbatches=args.microbatches,
        loss_fn=torch.nn.functional.mse_loss,
        example_input=torch.zeros(rows, w),
        schedule=args.schedule,
        balance=args.balance,
        data_parallel=args.data_parallel,
    )
    del model, blocks  # this rank keeps its stages only
    opt = torch.optim.Adam(pipe.parameters(), lr=1e-3)
    first = None
    for step in range(args.steps):
        X, y = teacher_batch(step, args.batch, w)
        mine = slice(pipe.replica * rows, (pipe.replica + 1) * rows)
        opt.zero_grad()
        loss = pipe.step(X[mine], y[mine])
        opt.step()
        first = loss if first is None else first
        if step % 20 == 0 and torch.distributed.get_rank() == 0:
            print(f"step {step} loss {loss:.4f}", flush=True)
    state = pipe.full_state_dict()  # the unsplit model's state dict, on rank 0
    if state is not None:
        print(f"final loss {loss:.4f} (first {first:.4f}) with stages {pipe.split}, {len(state)} tensors")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
