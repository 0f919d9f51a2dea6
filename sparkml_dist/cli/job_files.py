"""A job file (``sparkml-dist ensemble|search|tune --conf job.yaml``): read, checked, its paths.  [driver]

* :func:`load_job`: the YAML read with ``yaml.safe_load`` (no tags, no objects) and checked before
  any Spark session starts: a top level that is not a mapping, or a local ``input.path`` that does
  not exist, is a one-line :class:`~sparkml_dist.ConfigurationError` naming the file and the key;
* :func:`resolve_paths`: relative ``input.path`` and ``output.*`` paths are taken from the job
  file's own folder (as its ``function:`` is), not from wherever the command was started;
* :func:`new_paths` / :func:`remove_new`: what a job would create (the outermost missing folder of
  each local output), so that a failed job leaves no empty or half-written output behind (outputs
  are written through :func:`sparkml_dist.formats.files.write_new` or Spark's committed writers).

Example::

    job, base = load_job("conf/job.yaml")          # before Spark starts
    fresh = new_paths(job)
    try:
        ...
    except BaseException:
        remove_new(fresh)
        raise
"""

from __future__ import annotations

import os
import shutil
from typing import List, Tuple

from ..errors import ConfigurationError


def load_job(path: str) -> Tuple[dict, str]:
    """``(job, its folder)``: the job file at ``path``, read and checked (see the module docstring)."""
    import yaml

    try:
        with open(path) as fh:
            job = yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigurationError(f"--conf {path}: cannot read the job file ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        why = getattr(exc, "problem", exc)
        raise ConfigurationError(f"--conf {path}: not valid YAML{at}: {why}") from None
    if not isinstance(job, dict):
        raise ConfigurationError(
            f"--conf {path}: the job file's top level must be a mapping of keys (input:, params:, "
            f"output: ...), got {type(job).__name__ if job is not None else 'an empty file'}"
        )
    base = os.path.dirname(os.path.abspath(path))
    job = resolve_paths(job, base)
    source = job.get("input")
    if isinstance(source, dict) and isinstance(source.get("path"), str):
        where = source["path"]
        if "://" not in where and not os.path.exists(where):
            raise ConfigurationError(
                f"--conf {path}: input.path {where} does not exist (a relative path is taken from the "
                "job file's folder)"
            )
    return job, base


def resolve_paths(job: dict, base: str) -> dict:
    """``job`` with relative input/output paths made absolute under ``base`` (the job's folder)."""
    job = dict(job)
    if isinstance(job.get("input"), dict) and isinstance(job["input"].get("path"), str):
        job["input"] = {**job["input"], "path": _under(base, job["input"]["path"])}
    if isinstance(job.get("output"), dict):
        job["output"] = {k: _under(base, v) if isinstance(v, str) else v for k, v in job["output"].items()}
    return job


def local_outputs(job: dict) -> List[str]:
    """The local paths a job's ``output:`` names (files and folders)."""
    out = job.get("output") if isinstance(job.get("output"), dict) else {}
    return [v for v in out.values() if isinstance(v, str) and "://" not in v and os.path.isabs(v)]


def new_paths(job: dict) -> List[str]:
    """For each local output of ``job``, the outermost of its folders (or itself) that does not
    exist yet: what removing undoes whatever the job made there."""
    out = []
    for path in local_outputs(job):
        top = None
        while not os.path.lexists(path):
            top, path = path, os.path.dirname(path)
        if top and top not in out:
            out.append(top)
    return out


def remove_new(paths: List[str]) -> None:
    """Remove what a failed job made at ``paths`` (which did not exist before it started)."""
    for p in paths:
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        elif os.path.lexists(p):
            os.unlink(p)


def _under(base: str, path: str) -> str:
    if "://" in path or os.path.isabs(path):
        return path
    return os.path.join(os.path.abspath(base), path)
