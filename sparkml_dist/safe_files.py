"""Reading files and names that someone else may have written.  [anywhere]

* :func:`checked_name`: a name read from a file (a manifest, a checkpoint record) is used only if it
  is a plain name inside its directory;
* :func:`read_regular`: a file is read only if it is a regular file (no link, FIFO or device) and
  never beyond its expected size, so a FIFO cannot hang a load nor ``/dev/zero`` exhaust memory;
* :func:`safe_members`: the members of a tar archive, refused unless each is a plain file or
  directory whose path stays inside the destination (whatever Python's ``tarfile`` filters do).

Example::

    data = read_regular("/models/run1/objects/g00001.skops", limit=4096, what="member 1")
"""

from __future__ import annotations

import errno
import os
import re
import stat
from typing import Any, List, Optional

from .model_checks import UnsafeModelError


def read_regular(path: str, limit: int, what: str) -> Optional[bytes]:
    """The bytes of the local regular file ``path`` (None if there is none), refused if it is a
    link, FIFO, device or directory, or longer than ``limit`` bytes; reads at most ``limit`` + 1
    bytes and never blocks on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
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


def checked_name(name: Any, pattern: "re.Pattern[str]", where: str) -> str:
    """``name`` read from a file, refused unless it is a plain name matching ``pattern`` (no ``..``,
    no absolute path, no other directory)."""
    if not isinstance(name, str) or not pattern.fullmatch(name) or ".." in name:
        raise UnsafeModelError(
            f"{where} names the file {name!r}, which is not a plain file name inside "
            "its directory; refusing to read it"
        )
    return name


def safe_members(tar: Any, dest: str, what: str) -> List[Any]:
    """The members of the open ``tarfile`` ``tar`` to extract into ``dest``; raises
    :class:`UnsafeModelError` naming the first member that is a link (symbolic or hard), a device
    or FIFO, has an absolute or ``..`` path, or would resolve outside ``dest``."""
    root = os.path.realpath(dest)
    members = tar.getmembers()
    for m in members:
        name = m.name
        if not (m.isfile() or m.isdir()):
            kind = "a link" if (m.issym() or m.islnk()) else "a device, FIFO or other special file"
            raise UnsafeModelError(
                f"{what}: member {name!r} is {kind}; archives may hold only files and folders"
            )
        parts = name.replace("\\", "/").split("/")
        if (
            name.startswith(("/", "\\"))
            or os.path.isabs(name)
            or ".." in parts
            or re.match(r"^[A-Za-z]:", name)
        ):
            raise UnsafeModelError(f"{what}: member {name!r} has an absolute or '..' path")
        target = os.path.realpath(os.path.join(root, name))
        if target != root and not target.startswith(root + os.sep):
            raise UnsafeModelError(f"{what}: member {name!r} would be written outside {dest}")
    return members
