"""Rank functions that train a network split or sharded over the ranks, then save it with
``torch_models.save`` on every rank (module-level so they pickle by reference)."""

import os

from tests.support.parallel_helpers import batch, build_model


def _train(model, params, steps, rows, split=lambda X, y: (X, y)):
    import torch

    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    for step in range(steps):
        X, y = split(*batch(step, rows))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(X), y).backward()
        opt.step()


def save_ddp(path, steps=3, rows=32):
    """DDP over the ranks, each on its half of the mini-batch; the wrapper is what gets saved."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from sparkml_dist.formats import networks as torch_models
    from sparkml_dist.runner import init_process_group

    init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DistributedDataParallel(build_model())
    per = rows // world
    _train(
        ddp,
        ddp.parameters(),
        steps,
        rows,
        lambda X, y: (X[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]),
    )
    written = torch_models.save(path, ddp, builder=build_model)
    return {"written": written, "state": {k: v.clone() for k, v in ddp.module.state_dict().items()}}


def save_fsdp(path, steps=3, rows=32):
    """FSDP2 (each rank holds a shard of every block): the full weights are gathered to save."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from sparkml_dist.formats import networks as torch_models
    from sparkml_dist.runner import init_process_group

    init_process_group()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = build_model()
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    _train(model, model.parameters(), steps, rows)
    written = torch_models.save(path, model, builder=build_model, builder_kwargs={"layers": 8, "width": 16})
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    held = sum(p.to_local().numel() for p in model.parameters())
    return {"written": written, "state": dict(full) if dist.get_rank() == 0 else None, "held": held}


def save_pipeline(path, steps=3, rows=32):
    """A two-stage pipeline: each rank holds its stages; the merged state is what gets saved."""
    import torch

    from sparkml_dist.formats import networks as torch_models
    from sparkml_dist.parallel import pipeline

    X0, _ = batch(0, rows)
    pipe = pipeline(
        build_model(), stages=2, microbatches=4, loss_fn=torch.nn.functional.cross_entropy, example_input=X0
    )
    opt = torch.optim.SGD(pipe.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        X, y = batch(step, rows)
        opt.zero_grad()
        pipe.step(X, y)
        opt.step()
    written = torch_models.save(path, pipe, builder=build_model)
    X, _ = batch(999, 10)
    return {
        "written": written,
        "state": pipe.full_state_dict(),
        "predict": pipe.predict(X),
        "rank": int(os.environ["RANK"]),
    }
