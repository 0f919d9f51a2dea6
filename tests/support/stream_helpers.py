"""Rank functions for the streamed data path: the samples of every global step, and an epoch
killed mid-way and resumed from its checkpoint (module-level so they pickle by reference)."""

import os


def step_ids(global_batch, seed=1):
    """Per global step, the ids this rank trained on."""
    from sparkml_dist.runner import shard

    loader = shard().dataloader(global_batch_size=global_batch, columns=["id"], seed=seed)
    return [b[0].tolist() for b in loader]


def ids_with_a_crash(log_dir, crash_after=None, global_batch=8):
    """One epoch; every id trained on is appended to ``log_dir``; a checkpoint after every step
    (the loader's position inside it); with ``crash_after`` k, every rank exits with code 3 once
    the step-k checkpoint is written, the first time only."""
    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import checkpoint, context, init_process_group, shard

    init_process_group()
    loader = shard().dataloader(global_batch_size=global_batch, columns=["id"], seed=7)
    state = checkpoint.load()  # gives the loader its saved position
    first = loader.state_dict()["step"]
    marker = os.path.join(log_dir, "crashed")
    with open(os.path.join(log_dir, f"rank{context().rank}-{os.getpid()}.ids"), "a") as fh:
        for (ids,) in loader:
            step = loader.state_dict()["step"] - 1
            fh.write(" ".join(map(str, ids.tolist())) + "\n")
            fh.flush()
            checkpoint.save({"step": torch.tensor(step)}, step)
            dist.barrier()  # every rank knows the step's checkpoint is written
            if crash_after is not None and step == crash_after and not os.path.exists(marker):
                dist.barrier()
                if context().rank == 0:
                    open(marker, "w").close()
                os._exit(3)
    return {"resumed_at": first, "restored": state is not None, "world": context().world_size}
