"""Training functions used by runner tests (module-level so they pickle by reference)."""

import os
import signal
import time


def allreduce_rank_sum(x=0):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"hello from rank {dist.get_rank()}", flush=True)
    keys = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    return {"sum": t.item(), "x": x, "env": {k: os.environ[k] for k in keys}}


def raise_slow_to_exit(rank_to_fail):
    """Rank ``rank_to_fail`` leaves the group (its peer's collective fails at once), then raises and
    is slow to exit (an ``atexit`` handler of 3 s, as a library's teardown can be under load)."""
    import atexit
    import time

    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    init_process_group()
    if dist.get_rank() == rank_to_fail:
        dist.destroy_process_group()
        atexit.register(time.sleep, 3)
        raise ValueError("failed by itself")
    dist.all_reduce(torch.ones(1))  # its peer left: this fails as a symptom, first
    dist.all_reduce(torch.ones(1))


def fail_on(rank_to_fail, how, step=2):
    """Train a few all-reduce steps; rank ``rank_to_fail`` fails at ``step`` in the way ``how``."""
    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    init_process_group()
    rank = dist.get_rank()
    for i in range(5):
        if rank == rank_to_fail and i == step:
            print(f"rank {rank} about to fail with {how}", flush=True)
            if how == "raise":
                raise ValueError(f"injected failure at step {i}")
            if how == "exit":
                os._exit(7)
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "hang":
                time.sleep(3600)
        t = torch.ones(1)
        dist.all_reduce(t)
    return rank


def sleep_before_init(rank_to_sleep, seconds):
    import torch.distributed as dist

    if int(os.environ["RANK"]) == rank_to_sleep:
        time.sleep(seconds)
    dist.init_process_group("gloo")
    dist.barrier()
    return "done"


def big_result(nbytes):
    return b"x" * nbytes


def shard_summary(batch_size=32, column="x"):
    """Rows, batches per epoch and the column's values, as this rank sees its shard."""
    import torch.distributed as dist

    from sparkml_dist.runner import context, init_process_group, shard

    init_process_group()
    s = shard()
    loader = s.dataloader(batch_size, [column], shuffle=True, seed=1)
    steps = 0
    for _ in loader:
        steps += 1
    values = sorted(s.to_numpy([column]).reshape(-1).tolist())
    dist.barrier()
    return {"rank": context().rank, "rows": s.num_rows, "steps": steps, "values": values}


def kill_my_executor(seconds_before):
    """Rank 1 SIGKILLs the executor JVM running its task, then everyone waits."""
    import torch.distributed as dist

    from tests.support.helpers import kill_my_executor_jvm

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        time.sleep(seconds_before)
        kill_my_executor_jvm()
    time.sleep(600)


def shard_in_order(column="x"):
    """This rank's values of ``column`` in shard order, and its rank (no collectives)."""
    from sparkml_dist.runner import context, shard

    return {"rank": context().rank, "values": shard().table.column(column).to_pylist()}


def train_with_checkpoints(
    steps=12, every=3, crash_at=None, crash_once_marker=None, crash_how="exit", blocking=True
):
    """A deterministic DDP regression: data of step s is drawn from seed (s, rank), so a run resumed
    from a checkpoint ends with exactly the weights of an uninterrupted run. Rank 1 exits with code
    3 at ``crash_at`` (only the first time, when ``crash_once_marker`` names a file to create), or
    with ``crash_how="kill_executor"`` SIGKILLs the executor JVM running its task.  ``crash_at`` a
    list: at each of those steps once (markers ``<crash_once_marker>.<step>``), by the last rank."""
    import os

    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import checkpoint, context, init_process_group

    init_process_group()
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = checkpoint.load()
    start = 0
    if state is not None:
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
    for step in range(start, steps):
        g = torch.Generator().manual_seed(step * 100 + context().rank)
        X = torch.randn(32, 4, generator=g)
        y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
        loss = torch.nn.functional.mse_loss(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == every - 1:
            state = {"model": net.state_dict(), "opt": opt.state_dict(), "step": step}
            checkpoint.save(state, step, blocking=blocking)
            dist.barrier()  # a blocking save is on disk before anyone goes on
        steps_to_crash = crash_at if isinstance(crash_at, (list, tuple)) else [crash_at]
        if (
            step in steps_to_crash
            and context().rank == max(1, dist.get_world_size() - 1) % dist.get_world_size()
        ):
            marker = crash_once_marker and (
                f"{crash_once_marker}.{step}" if isinstance(crash_at, (list, tuple)) else crash_once_marker
            )
            if marker is None or not os.path.exists(marker):
                if marker is not None:
                    open(marker, "w").close()
                if crash_how == "kill_executor":  # the executor JVM under this rank dies
                    from tests.support.helpers import kill_my_executor_jvm

                    kill_my_executor_jvm()
                    time.sleep(600)
                os._exit(3)
    return {"weight": net.weight.detach().clone(), "bias": net.bias.detach().clone(), "resumed_from": start}


def train_through_a_decommission(steps_dir, steps=40, every=25, notice_at=6, marker=None):
    """:func:`train_with_checkpoints`'s regression saved where ``checkpoint.due`` says: every
    ``every`` steps, and at the step the ranks hand over at after a decommission notice.  Each
    completed step is appended to ``steps_dir/rank<r>.txt``; at ``notice_at`` (once: ``marker``)
    the last rank decommissions the executor under it (SIGPWR) and trains on."""
    import os
    import signal

    import torch

    from sparkml_dist.runner import checkpoint, context, init_process_group

    init_process_group()
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = checkpoint.load()
    start = 0 if state is None else state["step"] + 1
    if state is not None:
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    rank, world = context().rank, context().world_size
    for step in range(start, steps):
        g = torch.Generator().manual_seed(step * 100 + rank)
        X = torch.randn(32, 4, generator=g)
        y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
        loss = torch.nn.functional.mse_loss(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with open(os.path.join(steps_dir, f"rank{rank}.txt"), "a") as f:
            f.write(f"{step}\n")
        if step == notice_at and rank == world - 1 and not os.path.exists(marker):
            open(marker, "w").close()
            from tests.support.helpers import kill_my_executor_jvm

            kill_my_executor_jvm(signal.SIGPWR)
        time.sleep(0.2)  # a step long enough for the driver's watch (twice a second) to see the notice
        if checkpoint.due(step, every):
            checkpoint.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": step}, step)
    return {"weight": net.weight.detach().clone(), "bias": net.bias.detach().clone(), "resumed_from": start}


def fail_differently(counter_file):
    """Rank 0 raises a different error on every attempt (the attempt number is kept in a file)."""
    from sparkml_dist.runner import context

    n = int(open(counter_file).read()) + 1 if os.path.exists(counter_file) else 1
    if context().rank == 0:
        with open(counter_file + ".tmp", "w") as fh:
            fh.write(str(n))
        os.replace(counter_file + ".tmp", counter_file)  # rank 1 never reads it half written
        raise RuntimeError(f"lost a disk on attempt {n}")
    return n


def start_with_device_mesh(sleep_s):
    """Distribution started by init_device_mesh (FSDP2 / tensor parallel style), then a long pause:
    the rank reached the rendezvous when it joined the store, not when it called a hooked name."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    time.sleep(sleep_s)
    t = torch.ones(1)
    dist.all_reduce(t, group=mesh.get_group())
    return t.item()


def start_with_rpc(sleep_s):
    """Distribution started by torch.distributed.rpc (its own c10d rendezvous)."""
    import torch.distributed.rpc as rpc

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world)
    time.sleep(sleep_s)
    answer = rpc.rpc_sync(f"worker{(rank + 1) % world}", max, args=(rank, 41))
    rpc.shutdown()
    return answer


def never_distributes(sleep_s):
    """One process doing its own work (e.g. several GPUs of one machine): no rendezvous at all."""
    time.sleep(sleep_s)
    return "alone"


def gpu_view():
    """Which GPU this rank was given (no CUDA needed: only the environment is read)."""
    from sparkml_dist.runner import context

    ctx = context()
    visible = (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")
    local_rank = int(os.environ["LOCAL_RANK"])
    return {
        "rank": ctx.rank,
        "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device": ctx.device,
        "local_rank": ctx.local_rank,
        "local_world_size": ctx.local_world_size,
        # what torch.cuda.set_device(int(os.environ["LOCAL_RANK"])) would pick (None: no such device)
        "picked": visible[local_rank] if local_rank < len(visible) else None,
        "group_rank": os.environ.get("GROUP_RANK"),
        "node_rank": os.environ.get("NODE_RANK"),
        "devices": list(ctx.devices),
    }


def shard_on_device(device):
    """Where to_torch and the dataloader put the shard when given ``device`` (meta stands in for a
    GPU on a CPU machine: the copy happens, the data does not)."""
    from sparkml_dist.runner import shard

    s = shard()
    whole = s.to_torch(["x", "y"], device=device)
    batch = next(iter(s.dataloader(4, ["x", "y"], device=device, pin_memory=True)))
    shape = list(whole.shape)
    return {"to_torch": whole.device.type, "batch": [b.device.type for b in batch], "shape": shape}


def chatty(fail_rank=1, progress=2000, long_bytes=3_000_000, numbered=100):
    """Output that used to kill a rank's log channel: a 3 MB line, a \\r progress bar redrawn
    2000 times, then ordinary lines; rank ``fail_rank`` then fails."""
    import sys

    rank = int(os.environ["RANK"])
    print("x" * long_bytes, flush=True)
    for i in range(progress):
        sys.stdout.write(f"\rprogress {i + 1}/{progress}")
    sys.stdout.write("\n")
    for i in range(numbered):
        print(f"line {i} of rank {rank}", flush=True)
    print("after the flood", flush=True)
    if rank == fail_rank:
        raise ValueError("boom after the flood")
    return rank


def shard_columns():
    """This rank's shard: its column names and row count."""
    from sparkml_dist.runner import shard

    s = shard()
    return {"columns": s.column_names, "rows": s.num_rows}


def resume_from(shared, elsewhere):
    """Rank 0 checkpoints step 5 in ``shared``; then rank 0 loads from ``shared`` and the others from
    ``elsewhere`` (another host's local directory when ``elsewhere != shared``)."""
    import torch.distributed as dist

    from sparkml_dist.runner import checkpoint, context, init_process_group

    init_process_group()
    checkpoint.save({"step": 5}, 5, directory=shared)
    dist.barrier()
    state = checkpoint.load(directory=shared if context().rank == 0 else elsewhere)
    return state["step"]


def spawn_and_hang(info_path):
    """Each rank starts a child process (as a data loader or a tool would), passes the rendezvous,
    records the child and its work directory in ``info_path``, then hangs until the run is cancelled."""
    import json
    import subprocess

    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    child = subprocess.Popen(["sleep", "600"])
    init_process_group()
    dist.barrier()
    with open(info_path, "a") as fh:
        fh.write(json.dumps({"cwd": os.environ["SPARKML_DIST_WORKDIR"], "child": child.pid}) + "\n")
    time.sleep(600)


def flood_or_talk(seconds=4.0, width=16384):
    """Rank 1 prints ``width``-character lines as fast as it can for ``seconds``; rank 0 prints 16
    short numbered lines over that time. Every rank returns how many lines it printed."""
    rank = int(os.environ["RANK"])
    end, printed = time.monotonic() + seconds, 0
    if rank == 1:
        line = "x" * (width - 1)
        while time.monotonic() < end:
            print(line, flush=True)
            printed += 1
        return printed
    for i in range(16):
        print(f"rank 0 says {i}", flush=True)
        printed += 1
        time.sleep(seconds / 16)
    time.sleep(0.5)
    return printed


def print_lines(n=30):
    """Print ``n`` numbered lines on every rank (with a pause, so they stream while the run goes on)."""
    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    init_process_group()
    for i in range(n):
        print(f"line {i}", flush=True)
        time.sleep(0.01)
    dist.barrier()
    return "done"


def exits_with(rank_to_exit, code):
    """Rank ``rank_to_exit`` calls sys.exit(code) inside the function (the others return)."""
    import sys

    from sparkml_dist.runner import context

    if context().rank == rank_to_exit:
        sys.exit(code)
    return "returned"


def leaves_a_collective(leaving, how):
    """Every rank all-reduces once; then rank ``leaving`` leaves quietly (``how``: "sys.exit" or
    "os._exit", code 0) while the others wait for it in the next all-reduce."""
    import sys

    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import context, init_process_group

    init_process_group()
    dist.all_reduce(torch.ones(4))
    if context().rank == leaving:
        sys.stdout.flush()
        sys.exit(0) if how == "sys.exit" else os._exit(0)
    dist.all_reduce(torch.ones(4))
    return "returned"


def setsid_children(marker, outcome):
    """Every rank starts a child in a session of its own (``setsid``) and a daemon that double-forks
    away from it, both running ``sleep`` with ``marker`` in their command line; then the function
    returns, raises or hangs (``outcome``: "return", "raise", "hang")."""
    import subprocess

    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    subprocess.Popen(["sleep", f"{marker}"], start_new_session=True)
    subprocess.Popen(["sh", "-c", f"(setsid sleep {marker}5 &) &"])  # reparented to init at once
    init_process_group()
    dist.barrier()
    if outcome == "raise":
        raise RuntimeError("failing after starting children")
    if outcome == "hang":
        time.sleep(3600)
    return "done"


def own_env_children(marker, outcome):
    """Every rank starts a child in a session of its own *with an environment of its own* (so no
    token of the run is in it), both directly and as a daemon that double-forks away, running
    ``sleep`` with ``marker`` in their command line; then the function returns, raises, is killed
    (SIGKILL to itself) or hangs (``outcome``: "return", "raise", "killed", "hang")."""
    import signal
    import subprocess

    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    subprocess.Popen(["sleep", f"{marker}"], start_new_session=True, env={})
    subprocess.Popen(["/bin/sh", "-c", f"(setsid sleep {marker}5 &) &"], env={})
    init_process_group()
    dist.barrier()
    if outcome == "raise":
        raise RuntimeError("failing after starting children")
    if outcome == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    if outcome == "hang":
        time.sleep(3600)
    return "done"


def lightning_multinode():
    """PyTorch Lightning's multi-node recipe, unchanged: Trainer(devices=1, num_nodes=2) on CPU
    (pyspark's TorchDistributor docs run it this way, one process per task)."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    x = torch.randn(64, 4)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        num_nodes=2,
        strategy="ddp",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Tiny()
    trainer.fit(model, data)
    return {
        "global_rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "node_rank": trainer.node_rank,
        "local_rank": trainer.local_rank,
        "weight": model.layer.weight.detach().tolist(),
    }


def shard_matrix(column):
    """This rank's ``column`` as the numpy array ``to_numpy`` gives, and its rank (no collectives)."""
    from sparkml_dist.runner import context, shard

    X = shard().to_numpy([column])
    return {"rank": context().rank, "shape": list(X.shape), "rows": X.tolist()}


def env_on_every_attempt(names, marker):
    """Each rank's values of ``names``; the first attempt fails (rank 1), the second returns."""
    import os

    from sparkml_dist.runner import context

    if context().rank == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("first attempt fails")
    return {n: os.environ.get(n) for n in names}


def stall_in_a_barrier(late_rank=1, late_by=4.0):
    """Every rank but ``late_rank`` waits in a barrier while ``late_rank`` is still busy."""
    import time

    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    init_process_group()
    if dist.get_rank() == late_rank:
        time.sleep(late_by)
    dist.barrier()
    return dist.get_rank()


def skip_an_all_reduce(skipper=1, hold=60.0):
    """Every rank takes one all-reduce; then ``skipper`` never enters the second (it sleeps)."""
    import time

    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    init_process_group()
    t = torch.ones(1)
    dist.all_reduce(t)
    if dist.get_rank() == skipper:
        time.sleep(hold)
        return -1
    dist.all_reduce(t)
    return dist.get_rank()


def staged_shard(stage_dir, batch_size=16):
    """This rank's ids and feature rows, its batches per epoch, and the run directories under
    ``stage_dir`` while the rank runs (the staged copy of the rows, if any)."""
    import os

    import torch.distributed as dist

    from sparkml_dist.runner import context, init_process_group, shard

    init_process_group()
    s = shard()
    steps = sum(1 for _ in s.dataloader(batch_size, ["id"], shuffle=True, seed=3))
    ids = s.to_numpy(["id"]).reshape(-1).astype(int).tolist()
    features = s.to_numpy(["features"]).tolist()
    hashed = s.to_numpy(["tf"])
    dist.barrier()
    runs = sorted(os.listdir(stage_dir)) if os.path.isdir(stage_dir) else []
    return {
        "rank": context().rank,
        "ids": ids,
        "features": features,
        "tf_width": int(hashed.shape[1]),
        "tf_sums": hashed.sum(axis=1).tolist(),
        "steps": steps,
        "staged": runs,
    }


def shard_rows(columns):
    """This rank's rows of ``columns`` as dicts, as ``shard().table`` holds them (no collectives)."""
    from sparkml_dist.runner import shard

    return shard().table.select(list(columns)).to_pylist()


def world_with_tqdm():
    """Joins the group and uses tqdm (a package whose version the executors' check compares)."""
    import torch.distributed as dist
    import tqdm

    from sparkml_dist.runner import init_process_group

    init_process_group()
    return [dist.get_world_size(), tqdm.__version__]


def store_after_rank0_returns(wait_s):
    """Rank 0 returns right after joining; the others use the store ``wait_s`` seconds later."""
    import time

    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    init_process_group()
    if dist.get_rank() == 0:
        return "returned"
    time.sleep(wait_s)
    store = dist.distributed_c10d._get_default_store()
    store.set("after_rank0", "yes")
    return "stored" if store.get("after_rank0") == b"yes" else "lost"
