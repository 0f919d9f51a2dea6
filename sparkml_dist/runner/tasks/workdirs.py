"""Where a rank runs: torchrun's working-directory rule, and archives unpacked there once.  [executor]

torchrun starts every rank in the directory it was launched from, so files a script writes next to
itself (``checkpoints/``, marker files, logs) persist after the run and are shared by the ranks of
a machine.  The same here (:func:`rank_cwd`):

* ranks on the machine the run was launched from (local processes, local masters) run in the
  driver's working directory;
* ranks on other machines run in one directory per machine and job,
  ``<tmp>/sparkml_dist-work-<uid>/<job>`` (``job`` names the script, or the function), kept after
  the run so that a second run of the same job finds what the first wrote (an FSDP2 checkpoint);
  ``BarrierRunner(work_dir=...)`` picks the directory instead, ``clean_work_dir=True`` removes the
  default one once every rank succeeded.

Whichever it is, the directory must be this user's own and writable by no one else (a world-
writable folder such as ``/tmp`` lets another user plant links where the runner writes): a given
``work_dir`` that is not is refused, a launch directory that is not is passed over for the default.

The runner's own files (the shard, the function, the result) stay in each rank's private directory
(``SPARKML_DIST_WORKDIR``), removed with the rank.  :func:`place_archive` unpacks an ``--archives``
file into the working directory once per machine (the first rank, under a lock; the others reuse
it), refusing to replace a folder of that name that the archive did not make.

Example::

    cwd = rank_cwd(spec, host_address())     # in the barrier task, before the rank starts
    place_archive(cwd, "vocab", data, "vocab.tgz")
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import stat
import tempfile
import uuid
from typing import Optional

from ...errors import ConfigurationError
from ...formats.files import private_dir_fault

_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def job_name(label: str) -> str:
    """A directory name for a job (a script's file name, a function's qualified name)."""
    stem = os.path.splitext(os.path.basename(label))[0] if label.endswith(".py") else label
    return (_NAME.sub("_", stem).strip("._") or "job")[:80]


def _private_dir(path: str) -> str:
    """Create ``path`` (mode 0700) or accept it if it is already a directory of ours, not a link:
    a fixed path under /tmp must not be one another user planted."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise ConfigurationError(
            f"{path} exists but is not a directory of this user (a link, a file, or someone else's): "
            "refusing to run ranks in it; remove it, or pick work_dir="
        )
    return path


def default_dir(job: str, base: Optional[str] = None) -> str:
    """``<base>/sparkml_dist-work-<uid>/<job>``: the kept working directory of a job on a machine."""
    root = _private_dir(os.path.join(base or tempfile.gettempdir(), f"sparkml_dist-work-{os.getuid()}"))
    return _private_dir(os.path.join(root, job_name(job)))


def _own_private(path: str) -> str:
    """Why ``path`` may not hold a rank's files ('' when it may): not a directory of this user, or
    writable by other users."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    return private_dir_fault(info)


def rank_cwd(work_dir: Optional[str], launch_dir: Optional[str], on_launch_machine: bool, job: str) -> str:
    """The working directory of a rank (see the module docstring)."""
    if work_dir:
        os.makedirs(work_dir, mode=0o700, exist_ok=True)
        why = _own_private(work_dir)
        if why:
            raise ConfigurationError(
                f"work_dir={work_dir!r} {why}: the ranks would write there through whatever another "
                "user planted. Pick a directory of your own that only you can write (chmod go-w), or "
                "leave work_dir unset."
            )
        return work_dir
    if on_launch_machine and launch_dir and os.access(launch_dir, os.W_OK) and not _own_private(launch_dir):
        return launch_dir
    return default_dir(job)


def open_log(directory: str, name: str):
    """``directory/name`` opened to append a rank's lines (text, line-buffered): the directory is
    made 0700 when missing and must be this user's own, writable by no one else (``log_dir``'s
    rule, as ``work_dir``'s); the file is created 0600 and never reached through a link, so a rank's
    output cannot land where another user reads it or planted a link."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        why = f"cannot be opened as a directory without following a link ({exc.strerror})"
    else:
        why = private_dir_fault(os.fstat(dfd))
    if why:
        raise ConfigurationError(
            f"log_dir={directory!r} {why}: every rank's output would be written where other users "
            "can read it or plant links. Pick a directory of your own that only you can write "
            "(chmod go-w), or leave log_dir unset (the executors' logs keep every line too)"
        )
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o600, dir_fd=dfd)
    finally:
        os.close(dfd)
    return os.fdopen(fd, "a", encoding="utf-8", buffering=1)


def _open_here(path: str, flags: int):
    """``path`` opened without following a link (one planted in its place is refused)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError as exc:
        raise ConfigurationError(f"{path} cannot be opened ({exc.strerror}); is it a link?") from None
    return os.fdopen(fd, "r+" if flags & os.O_RDWR else ("w" if flags & os.O_WRONLY else "r"))


def place_archive(cwd: str, alias: str, data: bytes, name: str, extract) -> str:
    """``cwd/alias`` holding the archive ``data`` (unpacked by ``extract(data, dest, what)``),
    made by the first rank of the machine; a folder of that name left by another archive or by
    the user is refused, naming ``file#name`` as the way out."""
    digest = hashlib.sha256(data).hexdigest()
    dest = os.path.join(cwd, alias)
    marker = os.path.join(cwd, f".{alias}.sparkml_dist-archive")
    with _open_here(os.path.join(cwd, f".{alias}.sparkml_dist-lock"), os.O_RDWR | os.O_CREAT) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if os.path.lexists(dest):
                if os.path.lexists(marker):
                    with _open_here(marker, os.O_RDONLY) as fh:
                        if fh.read(100).strip() == digest:
                            return dest  # unpacked already, by a sibling rank or an earlier run
                raise ConfigurationError(
                    f"--archives {name}: the working directory {cwd} already has {alias!r}, which "
                    f"this archive did not make; rename it with {name}#another_name"
                )
            tmp = os.path.join(cwd, f".{alias}.{uuid.uuid4().hex}.unpacking")
            try:
                extract(data, tmp, f"--archives {name}")
                os.rename(tmp, dest)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            with _open_here(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) as fh:
                fh.write(digest)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return dest
