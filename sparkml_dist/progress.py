"""Progress bars for jobs of many units (trials, search fits).  [driver]

``bar(total, desc, enabled)`` is a ``tqdm.auto`` bar (a widget in a notebook, a line in a
terminal), or a silent stand-in when ``enabled`` is False or tqdm is missing.  Updates are
thread-safe (tqdm's own lock).
"""

from __future__ import annotations

from typing import Any


class _Silent:
    n = 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def bar(total: int, desc: str, enabled: bool = True) -> Any:
    if not enabled:
        return _Silent()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency; a broken install stays quiet
        return _Silent()
    return tqdm(total=total, desc=desc, unit="trial" if "trial" in desc else "fit", dynamic_ncols=True)
