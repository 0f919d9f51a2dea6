"""The one place the model key signs and checks.  [anywhere]

The key is ``key=`` (``write().signed_with(key)``, ``members_table(key=...)``...) or the
``SPARKML_DIST_MODEL_KEY`` variable, at least :data:`MIN_KEY_BYTES` bytes (:func:`key_bytes`); a
variable set empty is refused rather than read as "no signing". What is signed:

* bytes (:func:`mac`): an HMAC-SHA256 with a key; without one a plain SHA-256, which finds a
  damaged file, not a forged one (a forger recomputes it);
* a JSON document without its own signature field (:func:`document_mac`), as it is written (sorted
  keys, the writer's indent).

Every check compares in constant time (:func:`same`). Used by the model store's manifest, saved
networks' ``model.json``, MLflow's ``MLmodel``, and members tables' rows.

Example::

    key = key_bytes(None)                                # the variable's key, or None
    sig = document_mac(manifest, key, field="signature", indent=1)
    same(manifest_on_disk["signature"]["mac"], sig)      # True when it verifies
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Any, Optional, Union

from ..errors import ConfigurationError

KEY_ENV = "SPARKML_DIST_MODEL_KEY"
MIN_KEY_BYTES = 16
ALG = "HMAC-SHA256"


def key_bytes(key: Optional[Union[str, bytes]]) -> Optional[bytes]:
    """``key`` (or the variable's, when None) as bytes; None when neither is set."""
    where = "key=" if key is not None else KEY_ENV
    if key is None and os.environ.get(KEY_ENV) == "":
        raise ConfigurationError(
            f"{KEY_ENV} is set but empty, which would turn signing off without a word: unset it "
            "(unsigned models) or set it to a key of at least 16 random bytes"
        )
    key = key if key is not None else os.environ.get(KEY_ENV)
    key = key.encode() if isinstance(key, str) else key
    if key is not None and len(key) < MIN_KEY_BYTES:
        raise ConfigurationError(
            f"the model signing key ({where}) is {len(key)} bytes long; use at least {MIN_KEY_BYTES} "
            "random bytes (e.g. python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return key


def mac(data: bytes, key: Optional[bytes]) -> str:
    """The hex HMAC-SHA256 of ``data`` under ``key``; its SHA-256 without a key."""
    return hmac.new(key, data, hashlib.sha256).hexdigest() if key else hashlib.sha256(data).hexdigest()


def document_mac(document: dict, key: Optional[bytes], field: str = "signature", indent: Any = None) -> str:
    """:func:`mac` of ``document`` without ``field``, as JSON with sorted keys and ``indent``."""
    body = json.dumps({k: v for k, v in document.items() if k != field}, indent=indent, sort_keys=True)
    return mac(body.encode(), key)


def same(given: Any, expected: str) -> bool:
    """Does ``given`` (read from a file: anything) equal ``expected``? In constant time."""
    return isinstance(given, str) and hmac.compare_digest(given, expected)
