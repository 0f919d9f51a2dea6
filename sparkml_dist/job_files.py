"""Paths and output files of a job file (``sparkml-dist ensemble|search|tune --conf job.yaml``).  [driver]

* :func:`resolve_paths`: relative ``input.path`` and ``output.*`` paths are taken from the job
  file's own folder (as its ``function:`` is), not from wherever the command was started;
* :func:`write_new`: an output file is written under a fresh random name created with
  ``O_CREAT | O_EXCL | O_NOFOLLOW`` beside its target, then renamed over it: a link planted at the
  target (``/tmp/results.csv -> ~/.bashrc``) is replaced, never followed, and readers never see a
  half-written file.

Example::

    job = resolve_paths(yaml.safe_load(open("conf/job.yaml")), "conf")
    write_new(job["output"]["results_csv"], results.to_csv(index=False).encode())
"""

from __future__ import annotations

import os
import uuid

_OUTPUT_DIRS = ("model_path",)


def resolve_paths(job: dict, base: str) -> dict:
    """``job`` with relative input/output paths made absolute under ``base`` (the job's folder);
    output folders are created."""
    job = dict(job)
    if isinstance(job.get("input"), dict) and isinstance(job["input"].get("path"), str):
        job["input"] = {**job["input"], "path": _under(base, job["input"]["path"])}
    if isinstance(job.get("output"), dict):
        out = {k: _under(base, v) if isinstance(v, str) else v for k, v in job["output"].items()}
        for key, value in out.items():
            if isinstance(value, str) and "://" not in value:
                os.makedirs(value if key in _OUTPUT_DIRS else os.path.dirname(value), exist_ok=True)
        job["output"] = out
    return job


def _under(base: str, path: str) -> str:
    if "://" in path or os.path.isabs(path):
        return path
    return os.path.join(os.path.abspath(base), path)


def write_new(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a new file that follows no link (see the module docstring)."""
    folder = os.path.dirname(os.path.abspath(path))
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
