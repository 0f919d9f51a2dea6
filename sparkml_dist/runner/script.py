"""Run a training *script* on every rank, as torchrun would.  [anywhere]

``run_script(source, path, argv)`` executes the script's source as ``__main__`` with ``sys.argv``
set, in the rank process the runner started (MASTER_ADDR, RANK, ... already set).  The source is
read on the driver and shipped with the run, so the script need not exist on the executors.
A ``sys.exit(0)`` (or None) is success; any other exit status fails the rank.  The script's folder
and any ``--py-files``/``--archives`` travel with it (:class:`ScriptFiles`, :func:`bundle`), so
it imports its sibling modules as it would under torchrun.

**The files a training script brings with it: its own folder, ``--py-files``, ``--archives``.**
Under ``torchrun``/``horovodrun`` a script imports its sibling modules (``from datautils import
...``) because its folder is ``sys.path[0]``.  Executors have no copy of that folder, so the driver
zips the Python files of the script's folder (packages included) into the run, and each rank
unpacks them into its work directory and puts them first on ``sys.path``.  As with
``spark-submit``, ``--py-files`` (``.py``, ``.zip``, ``.egg``, ``.whl``) go on ``sys.path`` too,
and ``--archives`` (``.zip``, ``.tar``, ``.tar.gz``/``.tgz``, ``.tar.bz2``, ``.tar.xz``;
``file#name`` picks the folder name) are unpacked into the rank's working directory.

Example::

    files = bundle("train.py", py_files=["libs.zip"], archives=["vocab.tar.gz#vocab"])
    runner.run(run_script, source, "train.py", argv, files)   # install() runs in each rank
"""

from __future__ import annotations

import io
import os
import sys
import zipfile
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..errors import ConfigurationError
from ..formats.files import extract_tar, extract_zip
from . import protocol


def run_script(source: str, path: str, argv: List[str], files: Optional[ScriptFiles] = None) -> None:
    if files is not None:  # the runner's files privately; archives into the working directory
        install(files, os.environ.get(protocol.WORKDIR_ENV, os.getcwd()), os.getcwd())
    code = compile(source, path, "exec")
    sys.argv = [path, *argv]
    namespace = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
    try:
        exec(code, namespace)  # noqa: S102 - running the user's own training script is the point
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise


MAX_BYTES = 64 << 20  # what a run carries to every rank; larger inputs belong on shared storage
_SKIP_DIRS = {"__pycache__", "node_modules", "site-packages", "venv", "env"}
_PY_FILES = (".py", ".zip", ".egg", ".whl")
_ARCHIVES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


@dataclass(frozen=True)
class ScriptFiles:
    """Plain bytes made on the driver: safe to ship with the run."""

    folder: bytes  # a zip of the script folder's Python files
    py_files: Tuple[Tuple[str, bytes], ...] = ()  # (file name, content)
    archives: Tuple[Tuple[str, str, bytes], ...] = ()  # (file name, folder name, content)


def _folder_zip(folder: str, budget: int) -> bytes:
    buf, total = io.BytesIO(), 0
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for here, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(here, name)
                total += os.path.getsize(path)
                if total > budget:
                    raise ConfigurationError(
                        f"the script's folder {folder} holds more than {budget >> 20} MiB of Python files "
                        "to ship to every rank; put the script in a folder of its own (with the modules "
                        "it imports), or pass those modules with --py-files"
                    )
                zf.write(path, os.path.relpath(path, folder))
    return buf.getvalue()


def _read(path: str, option: str, kinds: Sequence[str]) -> bytes:
    if not path.lower().endswith(tuple(kinds)):
        raise ConfigurationError(f"{option}: {path!r} is not one of {', '.join(kinds)}")
    if not os.path.isfile(path):
        raise ConfigurationError(f"{option}: no file at {path!r}")
    with open(path, "rb") as fh:
        return fh.read()


def bundle(script: str, py_files: Sequence[str] = (), archives: Sequence[str] = ()) -> ScriptFiles:
    """The script's folder, ``py_files`` and ``archives`` (``path`` or ``path#name``) as bytes."""
    py = tuple((os.path.basename(p), _read(p, "--py-files", _PY_FILES)) for p in py_files)
    arch = []
    for spec in archives:
        path, _, alias = spec.partition("#")
        alias = alias or os.path.basename(path)
        if not alias or alias in (".", "..") or "/" in alias or os.sep in alias:
            raise ConfigurationError(f"--archives: {spec!r} names the folder {alias!r}; give a plain name")
        arch.append((os.path.basename(path), alias, _read(path, "--archives", _ARCHIVES)))
    used = sum(len(b) for _, b in py) + sum(len(b) for _, _, b in arch)
    if used > MAX_BYTES:
        raise ConfigurationError(
            f"--py-files and --archives total {used >> 20} MiB; a run carries at most {MAX_BYTES >> 20} "
            "MiB to every rank. Put large inputs on storage every executor reads (s3://, /dbfs, ...)."
        )
    folder = _folder_zip(os.path.dirname(os.path.abspath(script)), MAX_BYTES - used)
    return ScriptFiles(folder, py, tuple(arch))


def install(files: ScriptFiles, workdir: str, cwd: Optional[str] = None) -> None:
    """Unpack the script's folder and ``--py-files`` into ``workdir`` (the rank's private
    directory) and ``--archives`` into ``cwd`` (its working directory, once per machine: see
    :func:`.workdirs.place_archive`; default ``workdir``), and extend ``sys.path`` as torchrun and
    spark-submit would: the script's folder first, then ``--py-files``."""
    from .tasks.workdirs import place_archive

    src = os.path.join(workdir, "script-src")
    extract_zip(files.folder, src, "the script's folder")
    libs = os.path.join(workdir, "py-files")
    os.makedirs(libs, exist_ok=True)
    paths = [src]
    for name, data in files.py_files:
        path = os.path.join(libs, os.path.basename(name))
        with open(path, "wb") as fh:
            fh.write(data)
        paths.append(libs if name.endswith(".py") else path)
    for name, alias, data in files.archives:
        extract = extract_zip if name.lower().endswith(".zip") else extract_tar
        place_archive(cwd or workdir, alias, data, name, extract)
    sys.path[:0] = list(dict.fromkeys(paths))
