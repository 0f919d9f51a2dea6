"""Argument checks in one style: each refusal names the parameter, the value and what it takes.  [anywhere]

Every public entry point checks its arguments before any Spark job, process or collective starts,
with these helpers, so a message always reads ``<name> must be <what it takes>, got <value>``
followed by the fix when there is one::

    integer("max_restarts", max_restarts, minimum=0)
    seconds("timeout", timeout)                       # None allowed: no limit
    one_of("voting", voting, ("soft", "hard"))
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from .errors import ConfigurationError


def _refuse(name: str, takes: str, value: Any, fix: str) -> ConfigurationError:
    return ConfigurationError(f"{name} must be {takes}, got {value!r}" + (f"; {fix}" if fix else ""))


def integer(
    name: str, value: Any, minimum: int = 1, *, none_ok: bool = False, fix: str = ""
) -> Optional[int]:
    """``value``, an integer (never a bool) >= ``minimum``; or None when ``none_ok``."""
    if value is None and none_ok:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise _refuse(name, f"an integer >= {minimum}" + (" or None" if none_ok else ""), value, fix)
    return value


# The longest finite wait any timeout may be (about 31 years): Python's own waits
# (threading.TIMEOUT_MAX, ~292 years here), datetime.timedelta (torch.distributed's timeouts) and
# the milliseconds gloo and NCCL count in all hold it; inf or 1e14 overflow one of them in a rank.
MAX_SECONDS = 1e9


def seconds(name: str, value: Any, *, none_ok: bool = True, fix: str = "") -> Optional[float]:
    """``value``, a positive, finite number of seconds up to :data:`MAX_SECONDS`; or None (no
    limit) when ``none_ok``."""
    if value is None and none_ok:
        return None
    takes = f"a positive number of seconds up to {MAX_SECONDS:g}" + (" or None (no limit)" if none_ok else "")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= MAX_SECONDS:
        raise _refuse(name, takes, value, fix)
    return value


def one_of(name: str, value: Any, choices: Sequence[Any], *, fix: str = "") -> Any:
    """``value``, one of ``choices``."""
    if value not in tuple(choices):
        raise _refuse(name, f"one of {tuple(choices)}", value, fix)
    return value
