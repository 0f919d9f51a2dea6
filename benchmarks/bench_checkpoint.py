"""How long a checkpoint stops training: ``checkpoint.save`` blocking vs ``blocking=False``.

The state is a real model's and optimizer's (an MLP of ``--mib`` MiB of float32 weights, Adam's two
moments after one step: about 3x that in all), saved as rank 0 does inside a training function
(``RANK=0``, a local directory).  For each round and contender:

* **blocked**: the seconds ``save`` keeps the training thread (the whole write when blocking; the
  copy to host memory when not),
* **durable**: the seconds until ``LATEST`` names the new file (``checkpoint.wait()`` for the
  background write),
* **steps while writing**: training steps (forward, backward and Adam on a twin of the model, so
  the saved state never changes) the training thread ran between ``save`` returning and the write
  being durable, and their mean time against steps with no write in flight (the background
  write's cost to training).

Both contenders must write the same bytes (checked with SHA-256 every round).  Contenders alternate
their order each round; the load average is printed.

    python benchmarks/bench_checkpoint.py [--mib 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def build(mib: int):
    import torch

    width = 2048
    layers = max(1, round(mib * 2**20 / 4 / (width * width)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(64, width)

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    step()
    return model, opt, step


def digest(directory: str) -> str:
    import json

    meta = json.loads(open(os.path.join(directory, "LATEST")).read())
    with open(os.path.join(directory, meta["file"]), "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=200, help="MiB of model weights (the state is ~3x)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os.environ["RANK"] = "0"
    import torch

    from sparkml_dist.runner import checkpoint

    torch.set_num_threads(1)  # the other core is the background writer's, as on a busy rank
    model, opt, _ = build(args.mib)
    _, _, step = build(args.mib)  # training goes on on a twin, so every round saves the same state
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    state_bytes += sum(
        t.numel() * t.element_size()
        for s in opt.state_dict()["state"].values()
        for t in s.values()
        if torch.is_tensor(t)
    )
    t = time.perf_counter()
    for _ in range(5):
        step()
    alone = (time.perf_counter() - t) / 5
    print(f"state {state_bytes / 2**20:.0f} MiB; a training step alone {alone * 1000:.1f} ms", flush=True)

    results = {"blocking": [], "background": []}
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as root:
        for r in range(args.repeats):
            order = ["blocking", "background"] if r % 2 == 0 else ["background", "blocking"]
            digests = {}
            for name in order:
                d = os.path.join(root, f"{name}-{r}")
                state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": r}
                load = os.getloadavg()[0]
                t0 = time.perf_counter()
                checkpoint.save(state, r, directory=d, blocking=name == "blocking")
                blocked = time.perf_counter() - t0
                steps, t1 = 0, time.perf_counter()
                while name == "background" and checkpoint._background._thread.is_alive():
                    step()
                    steps += 1
                stepping = time.perf_counter() - t1
                checkpoint.wait()
                durable = time.perf_counter() - t0
                digests[name] = digest(d)
                per_step = stepping / steps if steps else float("nan")
                results[name].append((blocked, durable, steps, per_step))
                print(
                    f"round {r} {name:10s} load {load:4.2f} blocked {blocked:6.3f}s durable {durable:6.3f}s"
                    + (f" steps while writing {steps} at {per_step * 1000:.1f} ms" if steps else ""),
                    flush=True,
                )
            assert digests["blocking"] == digests["background"], "the two saves wrote different bytes"

    med = {k: [statistics.median(col) for col in zip(*v)] for k, v in results.items()}
    b, a = med["blocking"], med["background"]
    print("\nmedians of", args.repeats, "rounds (same bytes written every round):")
    print(f"  blocking save: training blocked {b[0]:.3f} s (durable after {b[1]:.3f} s)")
    print(f"  background save: training blocked {a[0]:.3f} s (durable after {a[1]:.3f} s)")
    print(f"  blocked time, background / blocking: {a[0] / b[0]:.3f}x (target <= 0.10x)")
    print(
        f"  training steps while the write was in flight: {a[2]:.0f}, {a[3] * 1000:.1f} ms each vs "
        f"{alone * 1000:.1f} ms alone ({a[3] / alone:.2f}x)"
    )


if __name__ == "__main__":
    main()
