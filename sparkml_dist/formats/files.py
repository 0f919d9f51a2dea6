"""Reading files and names that someone else may have written.  [anywhere]

* :func:`checked_name`: a name read from a file (a manifest, a checkpoint record) is used only if it
  is a plain name inside its directory;
* :func:`read_regular`: a file is read only if it is a regular file (no link, FIFO or device) and
  never beyond its expected size, so a FIFO cannot hang a load nor ``/dev/zero`` exhaust memory;
  :func:`read_file` does the same through a pyarrow file system (local or remote): every loader
  of the package (model stores, saved networks, checkpoints) reads through it;
* :func:`write_new`: an output file is written under a fresh random name created with
  ``O_CREAT | O_EXCL | O_NOFOLLOW`` beside its target, then renamed over it: a link planted at the
  target (``/tmp/results.csv -> ~/.bashrc``) is replaced, never followed, and readers never see a
  half-written file;
* :func:`extract_tar` / :func:`extract_zip`: an archive is unpacked only if every member is a
  plain file or folder whose path stays inside the destination (whatever the Python version's
  ``tarfile`` filters do: CVE-2025-4517 bypasses ``filter="data"`` on Pythons without its fix).

Example::

    data = read_regular("/models/run1/objects/g00001.skops", limit=4096, what="member 1")
"""

from __future__ import annotations

import errno
import os
import re
import stat
import uuid
from typing import Any, Optional

from ..errors import ConfigurationError
from .checks import UnsafeModelError


def private_dir_fault(info: os.stat_result) -> str:
    """Why a directory with this ``stat`` may not hold this user's run files ('' when it may): not
    a directory (a link, a file), another user's, or writable by other users."""
    if not stat.S_ISDIR(info.st_mode):
        return "is a link or a file, not a directory"
    if info.st_uid != os.getuid():
        return f"belongs to another user (uid {info.st_uid})"
    if info.st_mode & 0o022:
        return f"is writable by other users (mode {stat.filemode(info.st_mode)})"
    return ""


def read_regular(path: str, limit: int, what: str, dir_fd: Optional[int] = None) -> Optional[bytes]:
    """The bytes of the local regular file ``path`` (None if there is none), refused if it is a
    link, FIFO, device or directory, or longer than ``limit`` bytes; reads at most ``limit`` + 1
    bytes and never blocks on a FIFO. ``dir_fd``: ``path`` is relative to that open directory."""
    try:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeModelError(f"{what} is a symbolic link; refusing to follow it") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeModelError(f"{what} is not a regular file (a FIFO, device or directory); refused")
        chunks, left = [], limit + 1
        while left > 0:
            part = os.read(fd, min(left, 1 << 20))
            if not part:
                break
            chunks.append(part)
            left -= len(part)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise UnsafeModelError(f"{what} is longer than the {limit} bytes recorded for it; refused")
    return data


def read_file(fs, path: str, limit: int, what: str) -> Optional[bytes]:
    """The bytes of ``path`` on the pyarrow file system ``fs`` (None if there is none): on the
    local file system :func:`read_regular`; elsewhere refused unless the store calls it a regular
    file, and read no further than ``limit`` + 1 bytes."""
    from pyarrow import fs as pafs

    if isinstance(fs, pafs.LocalFileSystem):
        return read_regular(path, limit, what)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return None
    if info.type != pafs.FileType.File:
        raise UnsafeModelError(f"{what} is not a regular file; refused")
    with fs.open_input_stream(path) as src:
        data = src.read(limit + 1)
    if len(data) > limit:
        raise UnsafeModelError(f"{what} is longer than the {limit} bytes recorded for it; refused")
    return data


def write_new(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a new file that follows no link (see the module docstring);
    the folder is made when missing."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex}.part")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def checked_name(name: Any, pattern: "re.Pattern[str]", where: str) -> str:
    """``name`` read from a file, refused unless it is a plain name matching ``pattern`` (no ``..``,
    no absolute path, no other directory)."""
    if not isinstance(name, str) or not pattern.fullmatch(name) or ".." in name:
        raise UnsafeModelError(
            f"{where} names the file {name!r}, which is not a plain file name inside "
            "its directory; refusing to read it"
        )
    return name


def _bad_path(name: str) -> bool:
    parts = name.replace("\\", "/").split("/")
    return name.startswith(("/", "\\")) or bool(re.match(r"^[A-Za-z]:", name)) or ".." in parts


def _outside(root: str, name: str) -> bool:
    target = os.path.realpath(os.path.join(root, name))
    return target != root and not target.startswith(root + os.sep)


def extract_tar(data: bytes, dest: str, what: str) -> None:
    """Unpack the tar archive ``data`` into ``dest``, refusing it whole (:class:`ConfigurationError`
    naming the member) if any member is a link (symbolic or hard), a device, FIFO or other special
    file, has an absolute or ``..`` path, or would land outside ``dest``.  Nothing is written
    before every member passed; Python's ``filter="data"`` is applied on top where it exists."""
    import io
    import tarfile

    os.makedirs(dest, exist_ok=True)
    root = os.path.realpath(dest)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
        for m in members:
            if not (m.isfile() or m.isdir()):
                kind = "a link" if (m.issym() or m.islnk()) else "a device, FIFO or other special file"
                raise ConfigurationError(f"{what}: member {m.name!r} is {kind}; only files and folders pass")
            if _bad_path(m.name) or _outside(root, m.name):
                raise ConfigurationError(f"{what}: member {m.name!r} has an absolute or '..' path")
        extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(root, members=members, **extra)


def extract_zip(data: bytes, dest: str, what: str) -> None:
    """Unpack the zip archive ``data`` into ``dest`` under the rules of :func:`extract_tar`
    (a zip entry whose mode says link or special file is refused too)."""
    import io
    import zipfile

    os.makedirs(dest, exist_ok=True)
    root = os.path.realpath(dest)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for info in zf.infolist():
            kind = stat.S_IFMT(info.external_attr >> 16)  # 0: no Unix mode recorded
            if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                raise ConfigurationError(f"{what}: member {info.filename!r} is a link or special file")
            if _bad_path(info.filename) or _outside(root, info.filename):
                raise ConfigurationError(f"{what}: member {info.filename!r} has an absolute or '..' path")
        zf.extractall(root)
