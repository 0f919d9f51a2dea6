"""Functions run on GPU ranks by tests/gpu (module-level so they pickle by reference)."""

import os


def nccl_allreduce_and_where():
    """NCCL all-reduce on this rank's GPU; which physical GPU it was."""
    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import context, init_process_group

    init_process_group()  # NCCL with use_gpu
    dev = torch.device(context().device)
    t = torch.tensor([float(dist.get_rank() + 1)], device=dev)
    dist.all_reduce(t)
    props = torch.cuda.get_device_properties(dev)
    return {
        "sum": t.item(),
        "backend": dist.get_backend(),
        "device": str(dev),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "uuid": str(getattr(props, "uuid", props.name)),
        "count": torch.cuda.device_count(),
        "local_rank": int(os.environ["LOCAL_RANK"]),
    }


def set_device_local_rank():
    """What nearly every torchrun script starts with: torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    t = torch.ones(1, device="cuda")
    dist.all_reduce(t)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    uuids = [None] * dist.get_world_size()
    dist.all_gather_object(uuids, str(getattr(props, "uuid", props.name)))
    dist.destroy_process_group()
    return {"sum": t.item(), "uuids": uuids}


def ddp_on_gpu_with_shard_batches(steps=20):
    """DDP on the rank's GPU fed by a dataloader that copies batches there from pinned memory."""
    import numpy as np
    import pyarrow as pa
    import torch

    from sparkml_dist.runner import context, init_process_group
    from sparkml_dist.runner.data.shard import Shard

    init_process_group()
    dev = torch.device(context().device)
    rng = np.random.default_rng(context().rank)
    X = rng.normal(size=(2048, 16)).astype(np.float32)
    table = pa.table({"x": pa.array(list(X)), "y": (X[:, 0] > 0).astype(np.int64)})
    loader = Shard(table, [2048] * context().world_size, context().rank).dataloader(
        256, ["x", "y"], device=dev, pin_memory=True
    )
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 2).to(dev), device_ids=[dev.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, devices = [], set()
    for _ in range(steps):
        for xb, yb in loader:
            devices.add(str(xb.device))
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return {"first": losses[0], "last": losses[-1], "devices": sorted(devices)}


def one_process_on_its_gpus(seconds):
    """Never distributes: one process using its GPU(s) alone, longer than start_timeout."""
    import time

    import torch

    x = torch.ones(1024, device="cuda:0")
    time.sleep(seconds)
    return {"sum": x.sum().item(), "gpus": torch.cuda.device_count()}


def keras_on_gpu(steps=40):
    """Horovod's Keras program on sparkml_dist.keras, on this rank's GPU: NCCL averages the
    gradients (the group made first, so a world of one runs its collectives too)."""
    import keras
    import numpy as np
    import torch.distributed as dist

    import sparkml_dist.keras as hvd
    from sparkml_dist.runner import init_process_group

    init_process_group()  # NCCL with use_gpu
    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(steps * 32, 16)).astype("float32")
    y = (x @ np.linspace(-1, 1, 16)).astype("float32")
    model = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.02)), loss="mse")
    history = model.fit(
        x,
        y,
        batch_size=32,
        epochs=3,
        verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
    )
    return {
        "device": str(model.trainable_variables[0].value.device),
        "backend": dist.get_backend(),
        "keras": keras.backend.backend(),
        "loss": history.history["loss"],
        "weights": [float(np.sum(w)) for w in model.get_weights()],
    }
