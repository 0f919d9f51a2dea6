"""A package's public names loaded on first use (PEP 562).  [anywhere]

A package whose ``__init__`` imported every public name would make each of its modules cost the
whole package: an executor's Python worker importing one executor-side module of ``ensemble``
would import the driver's estimators and pyspark.ml (0.6 s), and every gang trial's rank
importing ``tune.trial`` would import the tuner and Optuna (0.1 s of a 0.4 s start). Such a
package names each public name's module instead, and the name is imported when first used.

Example::

    # a package's __init__.py
    _HOMES = {"Tuner": "tuner", "choice": "space"}      # name -> the module (in the package) holding it
    __getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, Tuple


def lazy_names(
    package: str, homes: Dict[str, str], namespace: Dict[str, Any]
) -> Tuple[Callable[[str], Any], Callable[[], List[str]]]:
    """The package's module-level ``__getattr__`` and ``__dir__``: ``homes`` maps each public name
    to the module of ``package`` that defines it; a loaded name is kept in ``namespace`` (the
    package's ``globals()``), so it is looked up once."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{home}", package), name)
        namespace[name] = value
        return value

    def __dir__() -> List[str]:
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__
