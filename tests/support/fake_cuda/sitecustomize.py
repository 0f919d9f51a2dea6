"""A CUDA stand-in for rank processes on a machine without GPUs (tests/e2e): with FAKE_CUDA_LOG set,
``torch.cuda.set_device(i)`` records which physical GPU device index ``i`` is under the rank's
CUDA_VISIBLE_DEVICES (one JSON line per call) instead of touching a device."""

import json
import os

if os.environ.get("FAKE_CUDA_LOG") and os.environ.get("SPARKML_DIST_RUN_ID"):  # rank processes only
    import torch

    def _visible():
        return [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]

    def set_device(device):
        index = device.index if isinstance(device, torch.device) else int(device)
        visible = _visible()
        if not 0 <= index < len(visible):
            raise RuntimeError(f"CUDA error: invalid device ordinal {index} (visible: {visible})")
        with open(os.environ["FAKE_CUDA_LOG"], "a") as fh:
            fh.write(
                json.dumps({"rank": int(os.environ["RANK"]), "index": index, "gpu": visible[index]}) + "\n"
            )

    torch.cuda.set_device = set_device
    torch.cuda.device_count = lambda: len(_visible())
