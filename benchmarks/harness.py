"""What every benchmark here does the same way: run contenders interleaved, the order alternating
each round, the load average noted, and keep every wall time and each contender's last result."""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, List, Tuple


def interleaved(
    contenders: Dict[str, Callable[[], Any]], repeats: int
) -> Tuple[Dict[str, List[float]], dict]:
    """``(walls, last)``: the wall seconds of every round per contender, and its last result."""
    walls: Dict[str, List[float]] = {k: [] for k in contenders}
    last: Dict[str, Any] = {}
    for r in range(repeats):
        names = list(contenders) if r % 2 == 0 else list(contenders)[::-1]
        for name in names:
            load = os.getloadavg()[0]
            t = time.perf_counter()
            last[name] = contenders[name]()
            walls[name].append(time.perf_counter() - t)
            print(f"round {r} {name:18s} load {load:4.2f} wall {walls[name][-1]:7.2f}s", flush=True)
    return walls, last
