"""An unchanged torchrun-style GPU script's first lines (the CUDA calls go to tests/support/fake_cuda)."""

import os

import torch
import torch.distributed as dist

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("gloo")  # NCCL on a real GPU; the device choice above is what is checked
dist.barrier()
dist.destroy_process_group()
