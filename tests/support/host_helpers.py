"""Rank functions for the several-hosts pass (tests/hosts): each says where it ran and what it
saw, so a test can check addresses, local ranks and listeners across hosts (module-level so
they pickle by reference)."""

import os
import socket
import time


def _listening_addresses(port: int) -> list:
    """The local addresses a TCP socket of this process's namespace listens on at ``port``."""
    found = []
    with open("/proc/net/tcp") as fh:
        for line in fh.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            host_hex, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                found.append(socket.inet_ntoa(bytes.fromhex(host_hex)[::-1]))
    return found


def where_am_i(steps=3):
    """An all-reduce across every rank; each rank says its host, address and environment."""
    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    init_process_group()
    t = torch.tensor([float(dist.get_rank() + 1)])
    for _ in range(steps):
        dist.all_reduce(t)
        t /= dist.get_world_size()
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    host = socket.gethostname()
    print(f"rank {dist.get_rank()} on {host} local_rank {os.environ['LOCAL_RANK']}", flush=True)
    listens = _listening_addresses(int(os.environ["MASTER_PORT"])) if dist.get_rank() == 0 else []
    dist.barrier()
    return {
        "host": host,
        "sum": float(total),
        "listens": listens,
        **{k: os.environ[k] for k in ("MASTER_ADDR", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE")},
    }


def train_steps(steps=40, pause=0.25, every=5, keep=2):
    """DDP-style training in small steps (an all-reduce per step) with checkpoints every ``every``
    steps; resumes from the last one; returns the weights, the step it resumed from and the
    world sizes it ran with.  A step prints ``step N`` so a test can act at a given step."""
    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import checkpoint, init_process_group

    init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = checkpoint.load()
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
    for step in range(start, steps):
        g = torch.Generator().manual_seed(step)
        X = torch.randn(64, 4, generator=g)
        y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
        # the global batch is the same 64 rows whatever the world size: a rank takes its slice,
        # the summed gradients are the whole batch's (up to float rounding)
        mine = slice(rank * 64 // world, (rank + 1) * 64 // world)
        opt.zero_grad()
        (((model(X[mine]) - y[mine]) ** 2).sum() / 64).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        if rank == 0:
            print(f"step {step} world {world}", flush=True)
        if step % every == every - 1:
            checkpoint.save(
                {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, step, keep=keep
            )
            dist.barrier()  # the checkpoint is on disk before anyone goes on
        time.sleep(pause)
    return {
        "weight": model.weight.detach().clone(),
        "bias": model.bias.detach().clone(),
        "resumed_from": state["step"] if state is not None else None,
        "world": world,
    }


def mark_started(folder):
    """Writes a file named for its rank: proof that the function ran."""
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, f"rank{os.environ['RANK']}"), "w").close()
    return True


def _global_batch(step: int):
    """Step ``step``'s 64 rows (the same whatever the world size: each rank takes its slice)."""
    import torch

    g = torch.Generator().manual_seed(step)
    X = torch.randn(64, 4, generator=g)
    return X, X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


def one_process(steps: int):
    """What one process computes on :func:`_global_batch`'s batches for ``steps`` steps."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        X, y = _global_batch(step)
        opt.zero_grad()
        (((model(X) - y) ** 2).sum() / 64).backward()
        opt.step()
    return model.weight.detach().clone(), model.bias.detach().clone()


def train_in_place(marks, least=30, pause=0.2, most=900):
    """Inside ``elastic.run`` (``executor_loss="replace"``, ``min_np``): :func:`_global_batch`'s
    rows, each rank its slice, until step ``least`` and, once the world shrank, until it is whole
    again (at most ``most`` steps).  Rank 0 prints ``step N world W``; each process leaves a
    ``start-<rank>-<pid>`` mark.  Returns the weights, each committed step's world size and the
    last generation's pids."""
    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import elastic, init_process_group

    init_process_group()
    open(os.path.join(marks, f"start-{dist.get_rank()}-{os.getpid()}"), "w").close()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = elastic.TorchState(model=model, optimizer=opt, step=0, sizes=[])
    _steps_in_place(state, least, pause, most)
    pids = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    return {"weight": model.weight.detach(), "bias": model.bias.detach(), "sizes": state.sizes, "pids": pids}


def _in_place(state, least, pause, most):
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    while (state.step < least or state.sizes[-1] < state.sizes[0]) and state.step < most:
        X, y = _global_batch(state.step)
        mine = slice(rank * 64 // world, (rank + 1) * 64 // world)
        state.optimizer.zero_grad()
        (((state.model(X[mine]) - y[mine]) ** 2).sum() / 64).backward()
        for p in state.model.parameters():
            dist.all_reduce(p.grad)
        state.optimizer.step()
        if rank == 0:
            print(f"step {state.step} world {world}", flush=True)
        state.sizes = state.sizes + [world]
        state.step += 1
        state.commit()
        time.sleep(pause)


def _steps_in_place(state, least, pause, most):
    from sparkml_dist.runner import elastic

    return elastic.run(_in_place)(state, least, pause, most)
