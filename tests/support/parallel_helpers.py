"""Training functions for the model-parallel tests (module-level so they pickle by reference)."""

import os

LAYERS, WIDTH, CLASSES = 8, 16, 4


def build_model(layers=LAYERS, width=WIDTH):
    import torch

    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh()) for _ in range(layers - 1)]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(width, CLASSES))


def batch(step, rows, width=WIDTH):
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(rows, width, generator=g), torch.randint(0, CLASSES, (rows,), generator=g)


def train_unsplit(steps, rows, lr=0.05):
    """The reference: one process, the whole model, the whole mini-batch."""
    import torch

    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(steps):
        X, y = batch(step, rows)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(X), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model.state_dict(), losses


def train_pipeline(
    steps,
    rows,
    stages,
    schedule,
    balance="compute",
    data_parallel=1,
    microbatches=4,
    lr=0.05,
    meta=False,
    load_reference=True,
):
    """``rows`` per step over all replicas; replica d trains on its slice of each mini-batch.
    ``meta``: the model is built on the meta device (no memory), each rank materialises its
    stages, then loads the reference weights with ``load_state_dict``."""
    import torch

    from sparkml_dist.parallel import pipeline

    per_replica = rows // data_parallel
    X0, _ = batch(0, per_replica)
    if meta:
        with torch.device("meta"):
            model = build_model()
        if not load_reference:  # each rank's own random init, as careless code would do
            torch.manual_seed(1000 + int(os.environ["RANK"]))
    else:
        model = build_model()
    pipe = pipeline(
        model,
        stages=stages,
        microbatches=microbatches,
        loss_fn=torch.nn.functional.cross_entropy,
        example_input=X0,
        schedule=schedule,
        balance=balance,
        data_parallel=data_parallel,
    )
    if meta and load_reference:
        pipe.load_state_dict(build_model().state_dict())
    opt = torch.optim.SGD(pipe.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(steps):
        X, y = batch(step, rows)
        mine = slice(pipe.replica * per_replica, (pipe.replica + 1) * per_replica)
        opt.zero_grad()
        losses.append(pipe.step(X[mine], y[mine]))
        opt.step()
    X, _ = batch(999, 10)
    return {
        "rank": int(os.environ["RANK"]),
        "split": pipe.split,
        "losses": losses,
        "state": pipe.full_state_dict(),
        "predict": pipe.predict(X),
        "params_here": sum(p.numel() for p in pipe.parameters()),
        "local": {k: v.detach().clone() for k, v in pipe.named_parameters()},
    }


def train_pipeline_with_checkpoints(steps=8, every=2, crash_at=None, rows=32):
    """Adam on a 2-stage pipeline, checkpointing pipe.state_dict(opt); rank 1 exits with code 3 at
    ``crash_at`` when the run started fresh (so a restart resumes and goes on)."""
    import torch

    from sparkml_dist.parallel import pipeline
    from sparkml_dist.runner import checkpoint

    X0, _ = batch(0, rows)
    pipe = pipeline(
        build_model(),
        stages=2,
        microbatches=4,
        loss_fn=torch.nn.functional.cross_entropy,
        example_input=X0,
        balance="memory",
    )
    opt = torch.optim.Adam(pipe.parameters(), lr=0.01)
    state = checkpoint.load()
    start = 0
    if state is not None:
        pipe.load_state_dict(state["pipe"], opt)
        start = state["step"] + 1
    for step in range(start, steps):
        if crash_at == step and start == 0 and int(os.environ["RANK"]) == 1:
            os._exit(3)
        X, y = batch(step, rows)
        opt.zero_grad()
        pipe.step(X, y)
        opt.step()
        if checkpoint.due(step, every):
            full = pipe.state_dict(opt)
            checkpoint.save({"pipe": full, "step": step}, step)  # rank 0 writes; others pass None
    return {"resumed_from": start, "state": pipe.full_state_dict()}


def train_unsplit_adam(steps=8, rows=32):
    import torch

    model = build_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(steps):
        X, y = batch(step, rows)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(X), y).backward()
        opt.step()
    return model.state_dict()


def pipeline_with(**overrides):
    """pipeline() with bad arguments: the ConfigurationError it raises, as text (None if none)."""
    import torch

    from sparkml_dist.parallel import pipeline

    kwargs = dict(
        stages=2, microbatches=4, loss_fn=torch.nn.functional.cross_entropy, example_input=batch(0, 32)[0]
    )
    model = overrides.pop("model", None) or build_model()
    kwargs.update(overrides)
    try:
        pipeline(model, **kwargs)
    except Exception as e:  # noqa: BLE001 - the test reads the type and the message
        import torch.distributed as dist

        return {"type": type(e).__name__, "message": str(e), "initialized": dist.is_initialized()}
    return None


def no_pickle_on_the_wire(steps=2, rows=32):
    """A pipeline run where torch's object collectives (which unpickle) fail if anything uses them."""
    import torch.distributed as dist

    def refuse(*a, **k):
        raise AssertionError("an object collective (pickle) was used")

    for name in (
        "send_object_list",
        "recv_object_list",
        "broadcast_object_list",
        "all_gather_object",
        "gather_object",
        "scatter_object_list",
    ):
        setattr(dist, name, refuse)
    out = train_pipeline(steps, rows, 2, "interleaved")
    return {"split": out["split"], "has_state": out["state"] is not None}


class NotSequential:
    """Stands for a model the pipeline cannot split (built in the rank: see bad_pipeline_args)."""


def _odd_model(kind):
    import torch

    if kind == "not_sequential":
        return torch.nn.Linear(WIDTH, CLASSES)
    if kind == "params_outside_blocks":

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = torch.nn.ModuleList([torch.nn.Linear(WIDTH, WIDTH) for _ in range(4)])
                self.head = torch.nn.Linear(WIDTH, CLASSES)

            def forward(self, x):
                for b in self.blocks:
                    x = b(x)
                return self.head(x)

        return Net()
    raise ValueError(kind)


def bad_pipeline_args(cases):
    """pipeline() on each case's arguments: what it raised, and whether a process group existed."""
    out = []
    for case in cases:
        case = dict(case)
        if "model" in case:
            case["model"] = _odd_model(case["model"])
        out.append(pipeline_with(**case))
    return out


def train_fsdp(steps, rows, lr=0.05, on_gpu=False):
    """FSDP2 (fully_shard over a 1-D DeviceMesh) on this rank's half of each mini-batch (on the
    rank's GPU with ``on_gpu``)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from sparkml_dist.runner import context, init_process_group

    init_process_group()
    world, rank = dist.get_world_size(), dist.get_rank()
    device = torch.device(context().device if on_gpu else "cpu")
    mesh = init_device_mesh(device.type, (world,))
    model = build_model().to(device)
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    per = rows // world
    for step in range(steps):
        X, y = batch(step, rows)
        X, y = X.to(device), y.to(device)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(
            model(X[rank * per : (rank + 1) * per]), y[rank * per : (rank + 1) * per]
        ).backward()
        opt.step()
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {
        "state": dict(full) if rank == 0 else None,
        "held": sum(p.to_local().numel() for p in model.parameters()),
    }


def frame(rows, seed=0):
    """A pandas frame of ``rows`` samples: id, f0..f15, label (what the DataFrame tests feed)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    pdf = pd.DataFrame(
        rng.normal(size=(rows, WIDTH)).astype("float32"), columns=[f"f{i}" for i in range(WIDTH)]
    )
    pdf.insert(0, "id", np.arange(rows))
    pdf["label"] = rng.integers(0, CLASSES, rows)
    return pdf


def pipeline_from_shard(steps, rows_per_step, data_parallel=1, stages=2, lr=0.05):
    """A pipeline fed from this rank's shard(), in shard order, ``rows_per_step`` rows a step;
    returns the ids it read (and their digest) and rank 0's merged weights."""
    import hashlib

    import torch

    from sparkml_dist.parallel import pipeline
    from sparkml_dist.runner import shard

    s = shard()
    X = torch.tensor(s.to_numpy([f"f{i}" for i in range(WIDTH)]), dtype=torch.float32)
    y = torch.tensor(s.to_numpy(["label"]).reshape(-1), dtype=torch.long)
    ids = [int(i) for i in s.to_numpy(["id"]).reshape(-1)]
    pipe = pipeline(
        build_model(),
        stages=stages,
        microbatches=2,
        loss_fn=torch.nn.functional.cross_entropy,
        example_input=X[:rows_per_step],
        data_parallel=data_parallel,
    )
    opt = torch.optim.SGD(pipe.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        part = slice(step * rows_per_step, (step + 1) * rows_per_step)
        opt.zero_grad()
        pipe.step(X[part], y[part])
        opt.step()
    return {
        "rank": int(os.environ["RANK"]),
        "replica": pipe.replica,
        "ids": ids,
        "digest": hashlib.sha256(X.numpy().tobytes() + y.numpy().tobytes()).hexdigest(),
        "state": pipe.full_state_dict(),
    }


def train_unsplit_on(pdf, ids, steps, rows_per_step, lr=0.05):
    """The reference for pipeline_from_shard: one process, the rows ``ids`` in that order."""
    import torch

    rows = pdf.set_index("id").loc[ids]
    X = torch.tensor(rows[[f"f{i}" for i in range(WIDTH)]].to_numpy(), dtype=torch.float32)
    y = torch.tensor(rows["label"].to_numpy(), dtype=torch.long)
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        part = slice(step * rows_per_step, (step + 1) * rows_per_step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(X[part]), y[part]).backward()
        opt.step()
    return model.state_dict()


def fsdp_from_shard(steps, rows_per_step, lr=0.05):
    """FSDP2 fed from this rank's own shard (the data-parallel layout), ``rows_per_step`` rows of
    it a step; returns the ids it read in order and rank 0's full weights."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from sparkml_dist.runner import init_process_group, shard

    init_process_group()
    s = shard()
    X = torch.tensor(s.to_numpy([f"f{i}" for i in range(WIDTH)]), dtype=torch.float32)
    y = torch.tensor(s.to_numpy(["label"]).reshape(-1), dtype=torch.long)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = build_model()
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        part = slice(step * rows_per_step, (step + 1) * rows_per_step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(X[part]), y[part]).backward()
        opt.step()
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    ids = [int(i) for i in s.to_numpy(["id"]).reshape(-1)]
    return {"ids": ids, "state": dict(full) if dist.get_rank() == 0 else None}
