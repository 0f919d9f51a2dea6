"""A corpus of hostile model payloads: each would create ``marker`` if anything ran it."""

import json
import os
import pickle

import numpy as np


def _global_call(module: str, name: str, arg: str) -> bytes:
    """A protocol-4 pickle calling ``module.name(arg)`` (STACK_GLOBAL resolves dotted names)."""

    def s(text: str) -> bytes:
        b = text.encode()
        return b"\x8c" + bytes([len(b)]) + b

    return b"\x80\x04" + s(module) + s(name) + b"\x93" + s(arg) + b"\x85R."


class _Reduce:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def pickles(marker: str) -> dict:
    """Pickles that run code when loaded; named by the bypass they stand for."""
    touch = f"touch {marker}"
    code = f"open({marker!r}, 'w').close()"
    return {
        "os.system reduce": pickle.dumps(_Reduce(os.system, touch)),
        "dotted global under sparkml_dist": _global_call("sparkml_dist.serialization", "os.system", touch),
        "dotted global under torch": _global_call("torch", "os.system", touch),
        "builtins exec via __main__": _global_call("__main__", "__builtins__.exec", code),
        "the package's run_script": pickle.dumps(
            _Reduce(
                __import__("sparkml_dist.runner.script", fromlist=["run_script"]).run_script, code, "x", []
            )
        ),
        "sklearn.utils._testing": _global_call("sklearn.utils._testing", "os.system", touch),
        "numpy object array": pickle.dumps(np.array([_Reduce(os.system, touch)], dtype=object)),
    }


def skops_files(marker: str) -> dict:
    """skops files naming types that run code or were never reviewed."""
    import skops.io as sio
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import FunctionTransformer

    return {
        "a function (os.system)": sio.dumps(os.system),
        "numpy object array of a function": sio.dumps(np.array([os.system], dtype=object)),
        "nested pipeline with a hostile step": sio.dumps(
            Pipeline([("scale", FunctionTransformer()), ("evil", FunctionTransformer(func=os.system))])
        ),
    }


def corpus(marker: str) -> dict:
    """{name: (format recorded in the manifest, bytes)}: every payload as an attacker would plant it."""
    out = {f"pickle: {k}": ("pickle", v) for k, v in pickles(marker).items()}
    out.update({f"pickle, no format (an old manifest): {k}": (None, v) for k, v in pickles(marker).items()})
    out.update({f"skops: {k}": ("skops", v) for k, v in skops_files(marker).items()})
    return out


def plant(store_dir: str, group: int, item: int, fmt, data: bytes) -> None:
    """Replace object (group, item) of a committed store with ``data``, fixing the manifest as an
    attacker who can write the directory (but holds no signing key) would."""
    import hashlib
    import json

    path = os.path.join(store_dir, "manifest.json")
    manifest = json.loads(open(path).read())
    for meta in manifest["objects"]:
        if meta["group"] == group and meta["item"] == item:
            with open(os.path.join(store_dir, meta["file"]), "wb") as fh:
                fh.write(data)
            meta.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
            if fmt is None:
                meta.pop("format", None)
            else:
                meta["format"] = fmt
            break
    else:
        raise AssertionError(f"no object ({group}, {item}) in {store_dir}")
    with open(path, "w") as fh:
        fh.write(json.dumps(manifest, indent=1, sort_keys=True))


def plant_in_block(store_dir: str, fmt, data: bytes) -> None:
    """Replace the first model of a grouped model's first block (Parquet: a members table) with
    ``data`` in ``fmt``, fixing the row's digest and the manifest as an attacker who can write the
    directory (but holds no signing key) would."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparkml_dist.ensemble.stored.key_blocks import BLOCK_ITEM
    from sparkml_dist.ensemble.stored.members_table import row_digest

    manifest = json.loads(open(os.path.join(store_dir, "manifest.json")).read())
    meta = min((m for m in manifest["objects"] if m["item"] == BLOCK_ITEM), key=lambda m: m["group"])
    table = pq.read_table(os.path.join(store_dir, meta["file"]))
    rows = table.to_pylist()
    r = rows[0]
    r.update(format=fmt, model=data)
    r["sha256"] = row_digest(
        r["group"], r["rows"], str(fmt), dict(r["metrics"] or []), r["record"], data, None
    )
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), sink)
    plant(store_dir, meta["group"], meta["item"], meta["format"], sink.getvalue())
