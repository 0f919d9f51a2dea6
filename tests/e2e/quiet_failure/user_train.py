"""A user's training function with a bug in rank 1 (its peer then loses it)."""


def train():
    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    init_process_group()
    if dist.get_rank() == 1:
        raise ValueError("my bug in rank 1")
    dist.barrier()
    return 1
