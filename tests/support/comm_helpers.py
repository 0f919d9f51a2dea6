"""Rank functions for tests/unit/test_comm.py: DDP's communication settings and DiLoCo on real
torch.distributed (gloo) ranks."""

import torch

FEATURES = 6


def _data(rank, rows, seed=0):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    X = torch.randn(rows, FEATURES, generator=g)
    y = X @ torch.arange(1.0, FEATURES + 1) / FEATURES + 0.1 * torch.randn(rows, generator=g)
    return X, y.unsqueeze(1)


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _flat(module):
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def accumulation(k=4, rows=8):
    """k micro-steps with accumulate=k vs one step of one process on every rank's rows at once."""
    import torch.distributed as dist

    from sparkml_dist.parallel import comm
    from sparkml_dist.runner import context, init_process_group

    init_process_group()
    rank, world = context().rank, context().world_size
    net = comm.ddp(_net(), accumulate=k)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    X, y = _data(rank, rows * k)
    lasts = []
    for m in range(k):
        with net.micro_step() as last:
            xb, yb = X[m * rows : (m + 1) * rows], y[m * rows : (m + 1) * rows]
            (torch.nn.functional.mse_loss(net(xb), yb) / k).backward()
        lasts.append(last)
    opt.step()
    reduced = net.buckets_reduced
    ref = _net()  # one process, one step on the concatenated global batch
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    Xs, ys = zip(*[_data(r, rows * k) for r in range(world)])
    torch.nn.functional.mse_loss(ref(torch.cat(Xs)), torch.cat(ys)).backward()
    ref_opt.step()
    dist.barrier()
    return {
        "lasts": lasts,
        "reduced": reduced,
        "diff": float((_flat(net.module) - _flat(ref)).abs().max()),
    }


def compressed(compression, steps=60, resume_at=None):
    """Train with a compression hook: the first and last loss; with ``resume_at``, also the
    weights of a second model resumed at that step from the first's saved state (comm state
    included), against the uninterrupted weights."""
    import copy

    from sparkml_dist.parallel import comm
    from sparkml_dist.runner import context, init_process_group

    init_process_group()
    rank = context().rank
    X, y = _data(rank, 256, seed=1)
    opts = dict(compression=compression, powersgd_rank=2, powersgd_start=3)

    def run(net, opt, start, stop, saved=None):
        losses = []
        for step in range(start, stop):
            xb, yb = X[(step * 32) % 256 :][:32], y[(step * 32) % 256 :][:32]
            loss = torch.nn.functional.mse_loss(net(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if saved is not None and step + 1 == resume_at:
                saved.update(
                    model=copy.deepcopy(net.module.state_dict()),
                    opt=copy.deepcopy(opt.state_dict()),
                    comm=copy.deepcopy(net.comm_state_dict()),
                )
        return losses

    from sparkml_dist.parallel import traffic

    net = comm.ddp(_net(), **opts)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    saved = {}
    with traffic.meter() as sent:  # what the hooks handed to gloo, measured
        losses = run(net, opt, 0, steps, saved if resume_at else None)
    out = {
        "first": sum(losses[:5]) / 5,
        "last": sum(losses[-5:]) / 5,
        "sent": dict(sent.by_dtype),
        "shapes": [list(p.shape) for p in net.module.parameters()],
    }
    if resume_at:
        again = comm.ddp(_net(), **opts)
        again.module.load_state_dict(saved["model"])
        again_opt = torch.optim.SGD(again.parameters(), lr=0.05, momentum=0.9)
        again_opt.load_state_dict(saved["opt"])
        again.load_comm_state_dict(saved["comm"])
        run(again, again_opt, resume_at, steps)
        out["resume_diff"] = float((_flat(again.module) - _flat(net.module)).abs().max())
    torch.distributed.barrier()
    return out


def bf16_on_gloo():
    import torch.distributed as dist

    from sparkml_dist.parallel import comm
    from sparkml_dist.runner import init_process_group

    init_process_group()
    try:
        comm.ddp(_net(), compression="bf16")
        text = "accepted"
    except Exception as exc:  # the refusal, as the user sees it
        text = f"{type(exc).__name__}: {exc}"
    dist.barrier()  # no rank leaves while another still needs rank 0's store
    return text


def diloco(sync_every, outer_lr, outer_momentum, nesterov, steps=16):
    """DiLoCo's weights after ``steps`` inner SGD steps, per step: are the ranks equal?; and plain
    DDP's weights after the same steps for comparison."""
    import torch.distributed as dist

    from sparkml_dist.parallel.diloco import DiLoCo
    from sparkml_dist.runner import context, init_process_group

    init_process_group()
    rank, world = context().rank, context().world_size
    X, y = _data(rank, 16 * steps, seed=2)
    model = _net()
    if rank == 1:  # a different start: DiLoCo makes it rank 0's
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    outer = DiLoCo(
        model, sync_every=sync_every, outer_lr=outer_lr, outer_momentum=outer_momentum, nesterov=nesterov
    )
    equal_after = []
    for step in range(steps):
        torch.nn.functional.mse_loss(
            model(X[step * 16 : (step + 1) * 16]), y[step * 16 : (step + 1) * 16]
        ).backward()
        inner.step()
        inner.zero_grad()
        synced = outer.step()
        mine = _flat(model)
        gathered = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(gathered, mine)
        equal_after.append((synced, all(torch.equal(gathered[0], g) for g in gathered)))
    ddp = torch.nn.parallel.DistributedDataParallel(_net())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(steps):
        torch.nn.functional.mse_loss(
            ddp(X[step * 16 : (step + 1) * 16]), y[step * 16 : (step + 1) * 16]
        ).backward()
        opt.step()
        opt.zero_grad()
    state = outer.state_dict()
    dist.barrier()
    return {
        "equal_after": equal_after,
        "vs_ddp": float((_flat(model) - _flat(ddp.module)).abs().max()),
        "bytes": outer.bytes_reduced,
        "syncs": state["syncs"],
        "params": int(sum(p.numel() for p in model.parameters())),
    }


def powersgd_wide(steps=4, bucket_cap_mb=None):
    """PowerSGD on gloo with a model of several DDP buckets (21 MiB of gradients): the steps end
    (torch's hook alone deadlocks there), one bucket all-reduced per step."""
    import torch.distributed as dist

    from sparkml_dist.parallel import comm
    from sparkml_dist.runner import init_process_group

    init_process_group()
    torch.manual_seed(0)
    wide = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048))
    try:
        net = comm.ddp(wide, compression="powersgd", powersgd_rank=4, bucket_cap_mb=bucket_cap_mb)
    except Exception as exc:
        dist.barrier()
        return f"{type(exc).__name__}: {exc}"
    for _ in range(steps):
        net(torch.randn(32, 512)).pow(2).mean().backward()
    dist.barrier()
    return {"buckets_reduced": net.buckets_reduced}


def run_settings(explicit_accumulate=None):
    """What ``comm.ddp(model)`` took from the run's ``comm=``: accumulation, DDP's bucket size,
    the compression hook (its steps train), and what an argument given there changes."""
    import os

    import torch.distributed as dist

    from sparkml_dist.parallel import comm
    from sparkml_dist.runner import context, init_process_group

    init_process_group()
    net = comm.ddp(_net(), accumulate=explicit_accumulate)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    X, y = _data(context().rank, 8 * net.accumulate)
    lasts = []
    for m in range(net.accumulate):
        with net.micro_step() as last:
            (torch.nn.functional.mse_loss(net(X[m * 8 : (m + 1) * 8]), y[m * 8 : (m + 1) * 8])).backward()
        lasts.append(last)
    opt.step()
    gathered = [None] * context().world_size
    dist.all_gather_object(gathered, _flat(net.module))
    dist.barrier()
    return {
        "accumulate": net.accumulate,
        "bucket_bytes": net.bucket_bytes_cap,
        "lasts": lasts,
        "reduced": net.buckets_reduced,
        "env": os.environ.get("SPARKML_DIST_COMM"),
        "same_weights": all(torch.equal(gathered[0], g) for g in gathered),
    }


def horovod_settings(second_threshold_mb=None):
    """``comm.horovod(opt, model)`` under ``BarrierRunner(backend="horovod", comm=...)``: the
    HOROVOD_* variables Horovod started with, the optimizer's accumulation and compression, two
    accumulated micro-steps trained to identical weights; with ``second_threshold_mb``, what a
    fusion threshold other than the one Horovod started with says."""
    import os

    import horovod.torch as hvd

    from sparkml_dist.parallel import comm

    model = _net()
    opt = comm.horovod(torch.optim.SGD(model.parameters(), lr=0.1), model)  # starts Horovod
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    X, y = _data(hvd.rank(), 16)
    for m in range(2):  # backward_passes_per_step=2: the all-reduce after the second
        torch.nn.functional.mse_loss(model(X[m * 8 : (m + 1) * 8]), y[m * 8 : (m + 1) * 8]).backward()
    opt.step()
    weights = hvd.allgather_object(_flat(model))
    out = {
        "env": {
            k: v for k, v in os.environ.items() if k in ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME")
        },
        "passes": opt.backward_passes_per_step,
        "compression": opt._compression.__name__,
        "same_weights": all(torch.equal(weights[0], w) for w in weights),
    }
    if second_threshold_mb is not None:
        try:
            comm.horovod(
                torch.optim.SGD(model.parameters(), lr=0.1), model, bucket_cap_mb=second_threshold_mb
            )
            out["second"] = "accepted"
        except Exception as exc:
            out["second"] = f"{type(exc).__name__}: {exc}"
    hvd.join()
    return out


def diloco_disagreeing(kind):
    """DiLoCo on ranks that disagree: ``"model"`` (Linear(4, 3) on rank 0, Linear(4, 5) on rank 1)
    or ``"sync_every"`` (3 and 4); what each rank's construction says."""
    from sparkml_dist.parallel.diloco import DiLoCo
    from sparkml_dist.runner import context, init_process_group

    init_process_group()
    rank = context().rank
    model = torch.nn.Linear(4, 3 if kind != "model" or rank == 0 else 5)
    try:
        DiLoCo(model, sync_every=(3 if rank == 0 else 4) if kind == "sync_every" else 8)
    except Exception as exc:  # noqa: BLE001 - the refusal is what the test reads
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


def _wide_net(width=300):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))


def reduced_by_servers(steps=12, rows=16, bucket_cap_mb=None, compression=None, width=300):
    """``steps`` SGD steps of ``comm.ddp`` (the run's reduction servers sum the buckets) against
    one process stepping on every rank's rows at once: the largest weight difference, the buckets
    the servers summed and the gradient bytes this worker sent them."""
    import torch.distributed as dist

    from sparkml_dist.parallel import comm, comm_reduction
    from sparkml_dist.runner import context, init_process_group

    init_process_group()
    rank, world = context().rank, context().world_size
    model, ref = _wide_net(width), _wide_net(width)  # the same weights: one per side
    options = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    net = comm.ddp(model, compression=compression, **options)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        X, y = _data(rank, rows, seed=step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(X), y).backward()
        opt.step()
        Xs, ys = zip(*[_data(r, rows, seed=step) for r in range(world)])
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(torch.cat(Xs)), torch.cat(ys)).backward()
        ref_opt.step()
    dist.barrier()
    client = comm_reduction.Client.of_run()
    return {
        "diff": float((_flat(net.module) - _flat(ref)).abs().max()),
        "buckets": net.buckets_reduced,
        "summed": client.buckets,
        "bytes": client.bytes_sent,
        "params": sum(p.numel() for p in model.parameters()),
    }


def kill_a_server_then_train():
    """Rank 0 kills one reduction server (a process connected to the run's store that is no
    worker) with SIGKILL once every worker wrapped its model, then every worker trains."""
    import os
    import signal

    import psutil
    import torch.distributed as dist

    from sparkml_dist.parallel import comm
    from sparkml_dist.runner import context, init_process_group

    init_process_group()
    net = comm.ddp(_wide_net())  # the group of workers and servers is formed
    workers = [None] * context().world_size
    dist.all_gather_object(workers, os.getpid())
    if context().rank == 0:
        port = int(os.environ["MASTER_PORT"])
        servers = {
            c.pid
            for c in psutil.net_connections("tcp")
            if c.raddr and c.raddr.port == port and c.pid and c.pid not in workers
        }
        os.kill(min(servers), signal.SIGKILL)
    for step in range(5):
        X, y = _data(context().rank, 8, seed=step)
        torch.nn.functional.mse_loss(net(X), y).backward()
    return "trained"


def plain_model_beside_servers():
    """A function that never wraps its model with comm.ddp: the servers wait, then end with the run."""
    from sparkml_dist.runner import context, init_process_group

    init_process_group()
    return context().rank, context().world_size


def elastic_beside_servers():
    """A function under ``elastic.run`` in a run with reduction servers (refused in the rank)."""
    from sparkml_dist.runner import elastic, init_process_group

    init_process_group()

    @elastic.run
    def train(state):
        return "trained"

    return train(elastic.TorchState())
