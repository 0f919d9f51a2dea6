"""The checkpoint directory's files, as :mod:`sparkml_dist.runner.checkpoint` reads and writes them.  [rank]

A *local* ``checkpoint_dir`` is held to ``work_dir``'s rule: a directory of this user, not a link,
not writable by other users (:func:`sparkml_dist.formats.files.private_dir_fault`). It is checked
each time it is opened — every ``save``, ``load`` and ``latest_step``, so at every attempt of a
run — and refused, naming why, before anything is read from it or written into it: a folder
another user planted (with their step 999 in it), or one swapped for their link between two
attempts, is never resumed from. Every file inside is opened relative to the directory's own
descriptor, without following a link; a file is written 0600 under a temporary name and renamed
into place, and the temporary file of a write that failed (a full disk) is removed at once.

A *remote* one (``s3://``, ``gs://``, ``hdfs://``) is reached through pyarrow: its permissions are
its store's; temporary files of failed writes are removed the same way.

Example::

    with open_dir("/dbfs/ckpt/run1") as d:
        d.put("LATEST", b"{...}")
        d.read("LATEST", limit=65536, what="the LATEST record")   # bytes, or None
"""

from __future__ import annotations

import os
import posixpath
import uuid
from typing import List, Optional

from ...errors import ConfigurationError
from ...formats.files import private_dir_fault, read_file


def open_dir(where: str):
    """The checkpoint directory ``where`` (a local path or a URI), checked and open."""
    if "://" in where:
        return RemoteDir(where)
    return LocalDir(os.path.abspath(where))


def _temporary(name: str) -> str:
    return f".{name}.{uuid.uuid4().hex[:12]}.tmp"


class LocalDir:
    """A local checkpoint directory, open by descriptor (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.root = path
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise self._refused(
                f"cannot be opened as a directory without following a link ({exc.strerror})"
            ) from None
        why = private_dir_fault(os.fstat(self.fd))
        if why:
            os.close(self.fd)
            raise self._refused(why)

    def _refused(self, why: str) -> ConfigurationError:
        return ConfigurationError(
            f"checkpoint_dir={self.root!r} {why}: a run would resume from, and write its weights into, "
            "whatever another user put there. Pick a directory of your own that only you can write "
            "(chmod go-w), or shared storage (s3://, gs://, hdfs://)"
        )

    def put(self, name: str, data) -> None:
        """``data`` as file ``name``: a new 0600 file under a temporary name, then renamed."""
        tmp = _temporary(name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600, dir_fd=self.fd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            self._remove(tmp)
            raise

    def read(self, name: str, limit: int, what: str) -> Optional[bytes]:
        """File ``name`` (None if there is none): a regular file, no link, at most ``limit`` bytes."""
        from ...formats.files import read_regular

        return read_regular(name, limit, what, dir_fd=self.fd)

    def names(self) -> List[str]:
        return os.listdir(self.fd)

    def delete(self, name: str) -> None:
        os.unlink(name, dir_fd=self.fd)

    def _remove(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self.fd)
        except OSError:
            pass

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RemoteDir:
    """A checkpoint directory on a store pyarrow opens (see the module docstring)."""

    def __init__(self, uri: str) -> None:
        from ...formats import store as model_store

        self.fs, self.root = model_store.filesystem(uri)

    def put(self, name: str, data) -> None:
        self.fs.create_dir(self.root, recursive=True)
        tmp = self.path(_temporary(name))
        try:
            with self.fs.open_output_stream(tmp) as fh:
                fh.write(data)
            self.fs.move(tmp, self.path(name))
        except BaseException:
            try:
                self.fs.delete_file(tmp)
            except OSError:
                pass
            raise

    def read(self, name: str, limit: int, what: str) -> Optional[bytes]:
        return read_file(self.fs, self.path(name), limit, what)

    def names(self) -> List[str]:
        from pyarrow import fs as pafs

        selector = pafs.FileSelector(self.root, allow_not_found=True)
        return [i.base_name for i in self.fs.get_file_info(selector)]

    def delete(self, name: str) -> None:
        self.fs.delete_file(self.path(name))

    def path(self, name: str) -> str:
        return posixpath.join(self.root, name)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


__all__ = ["LocalDir", "RemoteDir", "open_dir"]
