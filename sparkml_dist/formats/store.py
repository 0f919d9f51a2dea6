"""ModelStore: a directory of objects with a manifest, for results too large to collect.  [anywhere]

Executors :meth:`~ModelStore.write` objects (each under a temporary name, then renamed); only
small metadata rows come back through Spark, and the driver :meth:`~ModelStore.commit`\\ s the
manifest last, so readers never see a half-written file.  Layout::

    <root>/manifest.json                        written last, in one rename: each object's format,
                                                file, size and SHA-256, the writer's id and, when
                                                signed, the HMAC-SHA256 of all that (``signature``)
    <root>/objects/g00003-i0-<writer>-<n>.skops one committed file per (group, item)
    <root>/_tmp/<writer>-...                    in-flight writes, removed by their writer's commit

Several writers may share a store: each :class:`ModelStore` object is one writer (its id travels
with it to the executors and names every file it writes).  A commit swaps the manifest in one
rename and removes only its own writer's files: other attempts of its tasks, its temporary files,
and the objects of a manifest of its own that it replaces.  Files of other writers are never
touched, so a commit cannot break a concurrent writer's commit (the last manifest wins whole).

Loading runs no code: each object is read in the format the manifest records
(:mod:`sparkml_dist.formats`, which also validates every tree structure); pickles are refused
unless ``allow_pickle=True``.  File names from the manifest must be plain names under ``objects/``;
a file is read only if it is a regular file (not a link, FIFO or device), and never more than its
recorded size + 1 bytes.  With a signing key of at least 16 bytes (``key=`` or the environment
variable ``SPARKML_DIST_MODEL_KEY``) ``commit`` signs the manifest inside the manifest itself (one
file, one rename: concurrent commits cannot leave a signature of one beside the manifest of the
other) and loading refuses a store whose signature is missing or wrong: the SHA-256 sums in the
manifest then make every file tamper-evident, not only corruption-evident.  A signature does not
stop a *replay*: an older store signed with the same key still verifies.  A load that races a
re-commit retries with the new manifest, so it returns the old or the new model, never a mix.

Example::

    store = ModelStore("file:///mnt/models/run1")
    meta = store.write(group=3, item=0, obj=model)      # on an executor
    store.commit([meta, ...])                           # on the driver
    model = ModelStore("file:///mnt/models/run1").load(3)
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import uuid
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import pyarrow as pa

from .. import formats as model_formats
from ..errors import CollectionError
from . import UnsafeModelError, signing
from .files import checked_name, read_file
from .signing import KEY_ENV, MIN_KEY_BYTES, key_bytes  # noqa: F401 - where they were

MAX_MANIFEST = 64 << 20
_FILE = re.compile(r"objects/[A-Za-z0-9][A-Za-z0-9_.-]{0,200}")
_EXTENSIONS = {f.name: f.extension for f in model_formats.FORMATS}


def filesystem(uri: str):
    """(pyarrow FileSystem, path) for a local path or a URI pyarrow understands."""
    from pyarrow import fs as pafs

    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    if uri.startswith("s3a://") or uri.startswith("s3n://"):
        uri = "s3://" + uri.split("://", 1)[1]
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        raise CollectionError(f"cannot open model store {uri!r}: {exc}") from exc


# reads of a store that each met a newer manifest (3 were not always enough for a reader beside
# two writers committing 30 times each, on a loaded 2-core machine)
READ_ATTEMPTS = 30


class ModelStore:
    """A directory of objects with a manifest (see the module docstring).

    ``key``: sign on commit and verify on load (bytes or str); default ``SPARKML_DIST_MODEL_KEY``.
    """

    MANIFEST = "manifest.json"
    SIGNATURE = "manifest.sig"  # where earlier releases signed, beside the manifest; still read
    FORMAT = "sparkml_dist.model_store/2"  # the format's name in every manifest: never renamed
    FORMAT_V1 = "sparkml_dist.model_store/1"  # sparkml_dist 0.1: pickles, no formats recorded

    def __init__(self, uri: str, *, key: Optional[Union[str, bytes]] = None) -> None:
        self.uri = uri
        self._key = key
        if key is not None:
            key_bytes(key)  # a short key is refused here, not at the first commit
        self._fs, self._root = filesystem(uri)
        self.writer = uuid.uuid4().hex[:16]  # names this writer's files; shipped with the store
        self.signed = False  # set by manifest(): the manifest carried a signature that verified

    def __getstate__(self):  # pyarrow file systems are re-opened where the store is used
        return {"uri": self.uri, "writer": self.writer}  # the key stays: executors do not sign

    def __setstate__(self, state):
        self.__init__(state["uri"])
        self.writer = state.get("writer", self.writer)

    def _path(self, *parts: str) -> str:
        return posixpath.join(self._root, *parts)

    def _put(self, path: str, data: bytes) -> None:
        """Write ``data`` under a temporary name, then move it to ``path``."""
        tmp = self._path("_tmp", f"{self.writer}-{uuid.uuid4().hex}.part")
        self._fs.create_dir(self._path("_tmp"), recursive=True)
        with self._fs.open_output_stream(tmp) as out:
            out.write(data)
        self._fs.move(tmp, path)

    # ------------------------------------------------------------------ executor side
    def write(self, group: int, item: int, obj: Any, *, allow_pickle: bool = False) -> dict:
        """Write one object in a format whose loading runs no code; returns its metadata for
        :meth:`commit` (send it back via collection). ``allow_pickle``: pickle what no safe format
        can hold (loading it will need ``allow_pickle`` too)."""
        fmt, data = model_formats.encode(obj, allow_pickle=allow_pickle)
        return self.write_bytes(group, item, data, fmt=fmt)

    def write_bytes(self, group: int, item: int, data: bytes, *, fmt: str = "pickle") -> dict:
        """Write bytes already in format ``fmt`` (one of :mod:`sparkml_dist.formats`')."""
        name = f"g{group:05d}-i{item}-{self.writer}-{uuid.uuid4().hex[:12]}.{_EXTENSIONS.get(fmt, 'bin')}"
        self._fs.create_dir(self._path("objects"), recursive=True)
        self._put(self._path("objects", name), data)
        return {
            "group": group,
            "item": item,
            "file": f"objects/{name}",
            "format": fmt,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }

    # ------------------------------------------------------------------ driver side
    def commit(self, metas: Iterable[dict], extra: Optional[dict] = None) -> dict:
        """Write the manifest listing one file per (group, item) (signed when there is a key), in one
        rename; then remove this writer's files that it does not list (see the module docstring)."""
        chosen: Dict[Tuple[int, int], dict] = {}
        for meta in sorted(metas, key=lambda m: (m["group"], m["item"], m["file"])):
            chosen.setdefault((meta["group"], meta["item"]), meta)
        manifest = {
            "format": self.FORMAT,
            "writer": self.writer,
            "objects": [chosen[k] for k in sorted(chosen)],
            **(extra or {}),
        }
        replaced = self._own_manifest_files()
        self._fs.create_dir(self._root, recursive=True)
        key = key_bytes(self._key)
        if key is not None:
            manifest["signature"] = {"alg": signing.ALG, "mac": signing.document_mac(manifest, key, indent=1)}
        self._put(self._path(self.MANIFEST), json.dumps(manifest, indent=1, sort_keys=True).encode())
        keep = {m["file"] for m in manifest["objects"]}
        self._remove_own(keep, replaced - keep)
        return manifest

    def _own_manifest_files(self) -> set:
        """Files listed by the committed manifest when this writer committed it (else none)."""
        body = self._read(self.MANIFEST)
        try:
            old = json.loads(body.decode()) if body is not None else {}
        except ValueError:
            return set()
        if not isinstance(old, dict) or old.get("writer") != self.writer:
            return set()
        return {m.get("file") for m in old.get("objects", []) if isinstance(m, dict)}

    def _remove_own(self, keep: set, also: set) -> None:
        """Delete this writer's unlisted objects and temporary files, and ``also`` (its replaced
        manifest's objects); another writer's files stay."""
        from pyarrow import fs as pafs

        tag = f"-{self.writer}-"
        for sub in ("objects", "_tmp"):
            infos = self._fs.get_file_info(pafs.FileSelector(self._path(sub), allow_not_found=True))
            for info in infos:
                rel = posixpath.relpath(info.path, self._root)
                mine = tag in "-" + posixpath.basename(rel) or rel in also
                if info.type == pafs.FileType.File and mine and rel not in keep:
                    self._fs.delete_file(info.path)

    def _read(self, name: str, limit: int = MAX_MANIFEST) -> Optional[bytes]:
        """File ``name`` of the store (None if absent): a regular file of at most ``limit`` bytes,
        of which at most ``limit`` + 1 are read (see :func:`read_file`)."""
        return read_file(self._fs, self._path(name), limit, f"{name!r} of model store {self.uri!r}")

    def manifest(self) -> dict:
        """The committed manifest, its signature verified when there is a key."""
        body = self._read(self.MANIFEST)
        if body is None:
            raise CollectionError(
                f"no {self.MANIFEST} in model store {self.uri!r}: the write was never committed "
                "(or this is not a model store)"
            )
        try:
            manifest = json.loads(body.decode("utf-8"))
        except ValueError:
            raise UnsafeModelError(f"the manifest of model store {self.uri!r} is not JSON") from None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("objects", []), list):
            raise UnsafeModelError(f"the manifest of model store {self.uri!r} is not a manifest")
        self.signed = self._verify(manifest, body)
        for meta in manifest.get("objects", []):
            if not isinstance(meta, dict):
                raise UnsafeModelError(f"the manifest of model store {self.uri!r} lists a non-object")
            checked_name(meta.get("file"), _FILE, f"the manifest of {self.uri!r}")
        manifest.pop("signature", None)
        return manifest

    def _verify(self, manifest: dict, body: bytes) -> bool:
        key = key_bytes(self._key)
        if key is None:
            return False
        signature = manifest.get("signature")
        if signature is not None:
            mac = signature.get("mac", "") if isinstance(signature, dict) else ""
            expected = signing.document_mac(manifest, key, indent=1)
        else:
            legacy = self._read(self.SIGNATURE, 4096)  # a store signed by an earlier release
            if legacy is None:
                raise UnsafeModelError(
                    f"model store {self.uri!r} is not signed, and a signing key is set "
                    f"({KEY_ENV} or key=): refusing to load it"
                )
            try:
                mac = json.loads(legacy.decode())["mac"]
            except (ValueError, KeyError, TypeError):
                mac = ""
            expected = signing.mac(body, key)
        if not signing.same(mac, expected):
            raise UnsafeModelError(
                f"the signature of model store {self.uri!r} does not match its manifest "
                "under the signing key: it was modified or signed with another key"
            )
        return True

    def read_bytes(self, meta: dict) -> bytes:
        name = checked_name(meta.get("file"), _FILE, f"the manifest of {self.uri!r}")
        size = meta.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise UnsafeModelError(f"the manifest of {self.uri!r} gives {name!r} no valid size")
        data = self._read(name, size)
        if data is None:
            raise CollectionError(
                f"model file {name!r} that the manifest of {self.uri!r} lists is missing: removed by "
                "a later commit, or never copied with the store"
            )
        if len(data) != size or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            raise CollectionError(
                f"model file {name!r} in {self.uri!r} does not match its checksum in the "
                "manifest: it is corrupt or was modified after it was written"
            )
        return data

    def missing(self, files: Iterable[str]) -> List[str]:
        """Those of ``files`` (names as a manifest lists them) this process cannot see in the store."""
        from pyarrow import fs as pafs

        return [f for f in files if self._fs.get_file_info(self._path(f)).type == pafs.FileType.NotFound]

    def decode(
        self, meta: dict, trusted_types: Iterable[str] = (), allow_pickle: bool = False, signed: bool = False
    ) -> Any:
        """The object one manifest entry names, checked against its size and SHA-256 and decoded
        (``trusted_types`` and ``allow_pickle`` as in :mod:`sparkml_dist.formats`)."""
        what = f"{meta['file']!r} of model store {self.uri!r}"
        return model_formats.decode(
            meta.get("format"),
            self.read_bytes(meta),
            trusted_types=trusted_types,
            allow_pickle=allow_pickle,
            what=what,
            signed=signed,
        )

    def _consistent(self, read: Callable[[dict], Any]) -> Any:
        """``read(manifest)`` against one committed manifest: if a file it lists vanished or
        changed meanwhile (a re-commit replaced it), again against the new manifest, as long as
        each failure met a newer one (writers committing meanwhile), at most
        :data:`READ_ATTEMPTS` times; a failure against an unchanged manifest is the store's."""
        for attempt in range(READ_ATTEMPTS):
            manifest = self.manifest()
            try:
                return read(manifest)
            except CollectionError as exc:
                last = attempt == READ_ATTEMPTS - 1
                if last or isinstance(exc, UnsafeModelError) or self.manifest() == manifest:
                    raise
        raise AssertionError("unreachable")

    def load(
        self, group: int, item: int = 0, *, trusted_types: Iterable[str] = (), allow_pickle: bool = False
    ) -> Any:
        """One object; ``trusted_types`` and ``allow_pickle`` as in :mod:`sparkml_dist.formats`."""

        def read(manifest: dict) -> Any:
            for meta in manifest["objects"]:
                if meta.get("group") == group and meta.get("item") == item:
                    return self.decode(meta, trusted_types, allow_pickle, self.signed)
            raise CollectionError(f"model store {self.uri!r} has no object for group {group}, item {item}")

        return self._consistent(read)

    def load_all(
        self, *, trusted_types: Iterable[str] = (), allow_pickle: bool = False
    ) -> Dict[Tuple[int, int], Any]:
        return self._consistent(
            lambda manifest: {
                (m["group"], m["item"]): self.decode(m, trusted_types, allow_pickle, self.signed)
                for m in manifest["objects"]
            }
        )
