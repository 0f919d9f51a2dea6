"""Plain values as JSON: what the ``json`` model format writes, exactly as it reads back.  [anywhere]

Dicts with string keys, lists, strings, numbers (NaN and infinities too), booleans and None, and
dates, datetimes and decimals tagged (``{"__date__": "2024-01-02"}``), so each comes back as the
type it was.

Example::

    to_json({"d": datetime.date(2024, 1, 2)})   # b'{"d": {"__date__": "2024-01-02"}}'
"""

from __future__ import annotations

import datetime
import decimal
import json
from typing import Any

_JSON = (str, int, float, bool, type(None))  # what json itself writes and reads back
_SCALARS = (*_JSON, datetime.date, decimal.Decimal)


def is_plain(value: Any, tagged: bool = True) -> bool:
    """JSON round-trips ``value`` exactly: dicts with string keys, lists, strings, numbers,
    booleans, None, and (``tagged``) dates and decimals (not tuples, not numpy values)."""
    if type(value) in _JSON or (tagged and (type(value) in _SCALARS or isinstance(value, datetime.date))):
        return True  # Python's json writes and reads NaN and Infinity too
    if type(value) is list:
        return all(is_plain(v, tagged) for v in value)
    if type(value) is dict:
        return all(type(k) is str and is_plain(v, tagged) for k, v in value.items())
    return False


def _tag(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return {"__datetime__": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"__date__": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {"__decimal__": str(value)}
    raise TypeError(f"{type(value).__name__} is not a plain value")


def _untag(obj: dict) -> Any:
    if len(obj) == 1:
        ((key, text),) = obj.items()
        if key == "__datetime__":
            return datetime.datetime.fromisoformat(text)
        if key == "__date__":
            return datetime.date.fromisoformat(text)
        if key == "__decimal__":
            return decimal.Decimal(text)
    return obj


def to_json(value: Any) -> bytes:
    return json.dumps(value, default=_tag, sort_keys=True).encode()


def from_json(data: bytes) -> Any:
    return json.loads(data.decode("utf-8"), object_hook=_untag)
