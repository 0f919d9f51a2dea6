"""Split a DataFrame that is a plain Parquet scan into balanced row ranges read from its files.  [anywhere]

Moving a DataFrame through Spark to Python costs a row-to-Arrow conversion in the JVM (about 4 s
for 1,000,000 x 50 doubles on two cores) and, to split it, a shuffle.  When the DataFrame *is* a
set of Parquet files -- ``spark.read.parquet(path)`` or ``spark.table(t)`` over Parquet, optionally
with a ``select`` of plain columns -- each task can instead read its part of the files with pyarrow,
which decodes the same data in a fraction of that time (the approach of Petastorm and
``horovod.spark``, without their intermediate copy).

:func:`split_files` decides on the driver, from the optimized logical plan and the files' footers, and
returns ``None`` with the reason when the fast path does not apply, so callers fall back to Spark:

* the plan is ``Relation [...] parquet`` or ``Project [plain columns]`` over it: no filter, limit,
  sample, computed or renamed column, join, cache (``InMemoryRelation``), ...;
* every selected column is stored in every file under the same name with the type Spark reads
  (booleans, integers, floats, strings, binary and lists of those), or a Spark ML vector stored as
  Spark writes it, delivered as the ``array<double>`` ``vector_to_array`` makes of it
  (:func:`delivered_schema`, :func:`sparkml_dist.vectors.vector_lists`): not a partition column (``part=1/``
  directories), not a column missing from some files (``mergeSchema``);
* the files' scheme is one pyarrow opens (local paths, ``s3://``, ``gs://``, ``hdfs://``, ...)
  and the driver can read their footers.

The rows, in the order of the sorted file paths and their row groups, are cut into ``num_parts``
contiguous ranges whose sizes differ by at most one row; a range may start or end inside a row
group.  The split depends only on the files, so it is the same on every run.

Example::

    split, why = split_files(df, 4)
    if split is not None:
        batches = read(split, part=2)       # on an executor: an iterator of pyarrow RecordBatches
"""

from __future__ import annotations

import logging
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pyarrow as pa

from ...feature_arrays import is_vector
from ...vectors import vector_lists

log = logging.getLogger(__name__)

BATCH_ROWS = 16384  # rows per record batch: what a reader of the shard holds at once
_ATTR = re.compile(r"^[^#()\s][^#]*#\d+L?$")  # a plain attribute as Spark prints it: name#12 / id#3L


@dataclass(frozen=True)
class Slice:
    """Rows ``[start, stop)`` of row group ``row_group`` of the file at ``uri``."""

    uri: str
    row_group: int
    start: int
    stop: int


@dataclass(frozen=True)
class ParquetSplit:
    """What the tasks read: the columns, the Arrow schema Spark would deliver, each part's slices."""

    columns: Tuple[str, ...]
    schema: pa.Schema
    parts: Tuple[Tuple[Slice, ...], ...]
    rows: Tuple[int, ...]

    @property
    def num_rows(self) -> int:
        return sum(self.rows)


# --------------------------------------------------------------------------- driver
def _optimized_plan(df) -> str:
    """The optimized logical plan as text, every field printed (no '... N more fields')."""
    spark, key = df.sparkSession, "spark.sql.debug.maxToStringFields"
    before = spark.conf.get(key, None)
    spark.conf.set(key, str(1 << 30))
    try:
        from ... import _spark_env

        text = _spark_env.explain_extended(df)
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
    section = text.split("== Optimized Logical Plan ==", 1)[-1]
    return section.split("== Physical Plan ==", 1)[0]


def _check_shape(plan_text: str, columns: Sequence[str]) -> Optional[str]:
    """None when the plan is a Parquet relation, optionally under a projection of plain columns."""
    lines = [ln.rstrip() for ln in plan_text.strip().splitlines() if ln.strip()]
    if "more fields" in plan_text:
        return "its plan is too wide to inspect (spark.sql.maxToStringFields)"
    relation = re.compile(r"^(\+- )?Relation (\S+ )?\[.*\] parquet$")
    if len(lines) == 1 and relation.match(lines[0]):
        return None
    if (
        len(lines) == 2
        and lines[0].startswith("Project [")
        and lines[0].endswith("]")
        and relation.match(lines[1])
    ):
        items = [it.strip() for it in lines[0][len("Project [") : -1].split(", ")]
        names = [it.rsplit("#", 1)[0] for it in items]
        if all(_ATTR.match(it) for it in items) and names == list(columns):
            return None
        return "it computes or renames columns"
    other = re.match(r"^(\+- )?Relation (\S+ )?\[.*\] (\w+)$", lines[-1]) if lines else None
    if other and other.group(3) != "parquet" and len(lines) <= 2:
        return f"it reads {other.group(3)} files, not Parquet"
    top = lines[0].split(" ", 1)[0] if lines else "?"
    return f"it is not a plain Parquet scan (its plan has {top})"


def _norm(t: pa.DataType):
    """A type up to nullability and list field names; None for types the fast path does not read."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = _norm(t.value_type)
        return None if inner is None else ("list", inner)
    if pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t):
        return str(t)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    return None


def _footer(uri: str):
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    filesystem, path = pafs.FileSystem.from_uri(uri)
    with filesystem.open_input_file(path) as fh:
        meta = pq.ParquetFile(fh).metadata
    return meta


def _vector_columns(df) -> List[str]:
    return [f.name for f in df.schema.fields if f.dataType.simpleString() == "vector"]


def delivered_schema(df) -> pa.Schema:
    """The Arrow schema the ranks get: Spark's, with each Spark ML vector column as the
    ``array<double>`` that ``vector_to_array`` makes of it."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

    vectors = set(_vector_columns(df))
    fields = [
        StructField(f.name, ArrayType(DoubleType(), False), f.nullable) if f.name in vectors else f
        for f in df.schema.fields
    ]
    return to_arrow_schema(StructType(fields))


def unreadable_column(df) -> Optional[str]:
    """Why a column of ``df`` cannot be read from Parquet files as Spark delivers it, or None."""
    try:
        expected = delivered_schema(df)
    except Exception as exc:
        return f"its schema has types Arrow does not map ({exc})"
    for field in expected:
        if _norm(field.type) is None:
            return f"column {field.name!r} has type {field.type}, which is read through Spark"
    return None


def split_files(df, num_parts: int, widths=None) -> Tuple[Optional[ParquetSplit], str]:
    """``(split, "")`` when ``df`` can be read from its Parquet files, else ``(None, why not)``.
    ``widths``: the width of vector columns the driver knows, which every row read must have."""
    columns = list(df.columns)
    try:
        reason = _check_shape(_optimized_plan(df), columns)
    except Exception as exc:  # a plan we cannot read: Spark moves the data
        reason = f"its plan could not be inspected ({type(exc).__name__})"
    if reason:
        return None, reason
    reason = unreadable_column(df)
    if reason:
        return None, reason
    expected, vectors = delivered_schema(df), set(_vector_columns(df))
    for name, width in (widths or {}).items():
        if name in vectors:
            i = expected.get_field_index(name)
            field = expected.field(i)
            meta = {**(field.metadata or {}), WIDTH_KEY: str(int(width)).encode()}
            expected = expected.set(i, field.with_metadata(meta))
    uris = sorted(df.inputFiles())
    if not uris:
        return None, "it lists no input files"
    try:
        with ThreadPoolExecutor(max_workers=min(16, len(uris))) as pool:
            metas = list(pool.map(_footer, uris))
    except Exception as exc:  # an unknown scheme, no access from here, not Parquet after all
        return None, f"its files cannot be opened with pyarrow here ({type(exc).__name__}: {exc})"
    units: List[Tuple[str, int, int]] = []
    for uri, meta in zip(uris, metas):
        schema = meta.schema.to_arrow_schema()
        for field in expected:
            idx = schema.get_field_index(field.name)
            if idx < 0:
                return (
                    None,
                    f"column {field.name!r} is not stored in {uri} (a partition column, or "
                    "a column some files lack)",
                )
            stored, vector = schema.field(idx).type, field.name in vectors
            if not (is_vector(stored) if vector else _norm(stored) == _norm(field.type)):
                return (
                    None,
                    f"column {field.name!r} is stored as {stored} in {uri}, "
                    f"not as {'a Spark ML vector' if vector else field.type}",
                )
        units += [
            (uri, g, meta.row_group(g).num_rows)
            for g in range(meta.num_row_groups)
            if meta.row_group(g).num_rows > 0
        ]
    return _cut(tuple(columns), expected, units, num_parts), ""


def _cut(
    columns: Tuple[str, ...], schema: pa.Schema, units: List[Tuple[str, int, int]], num_parts: int
) -> ParquetSplit:
    """The row sequence of ``units`` (file, row group, rows) cut into ``num_parts`` contiguous ranges
    whose sizes differ by at most one row."""
    total = sum(n for _, _, n in units)
    bounds = [r * total // num_parts for r in range(num_parts + 1)]
    parts: List[List[Slice]] = [[] for _ in range(num_parts)]
    offset = 0
    for uri, g, n in units:
        for r in range(num_parts):
            lo, hi = max(bounds[r], offset), min(bounds[r + 1], offset + n)
            if lo < hi:
                parts[r].append(Slice(uri, g, lo - offset, hi - offset))
        offset += n
    rows = tuple(bounds[r + 1] - bounds[r] for r in range(num_parts))
    return ParquetSplit(columns, schema, tuple(tuple(p) for p in parts), rows)


# --------------------------------------------------------------------------- executors
WIDTH_KEY = b"sparkml_dist.width"  # a delivered vector column's width, in its field's metadata


def deliver(table: pa.Table, columns: Sequence[str], schema: pa.Schema, where: str = "") -> pa.Table:
    """``columns`` of rows read from the files, as Spark delivers ``schema``: a vector column stored
    as its struct becomes the ``array<double>`` the schema names (:func:`delivered_schema`), checked
    against the width the driver read (``where``: the file and row group, for the refusal)."""
    table = table.select(list(columns))
    for i, field in enumerate(schema):
        column = table.column(i)
        if is_vector(column.type) and not is_vector(field.type):
            width = (field.metadata or {}).get(WIDTH_KEY)
            lists = vector_lists(
                column, f"column {field.name!r}{where}", None if width is None else int(width)
            )
            table = table.set_column(i, field.name, lists)
    return table.cast(schema)


def read(split: ParquetSplit, part: int, batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The record batches of part ``part``, with the columns and types Spark would deliver."""
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    handles: Dict[str, pa.NativeFile] = {}
    readers: Dict[str, "pq.ParquetFile"] = {}
    columns = list(split.columns)
    try:
        for sl in split.parts[part]:
            pf = readers.get(sl.uri)
            if pf is None:
                filesystem, path = pafs.FileSystem.from_uri(sl.uri)
                handles[sl.uri] = filesystem.open_input_file(path)
                pf = readers[sl.uri] = pq.ParquetFile(handles[sl.uri])
            at = 0
            for batch in pf.iter_batches(
                batch_size=batch_rows, row_groups=[sl.row_group], columns=columns, use_threads=False
            ):
                lo, hi = max(sl.start - at, 0), min(sl.stop - at, batch.num_rows)
                at += batch.num_rows
                if lo < hi:
                    part = pa.Table.from_batches([batch.slice(lo, hi - lo)])
                    where = f" of {sl.uri}, row group {sl.row_group}"
                    yield from deliver(part, columns, split.schema, where).to_batches()
                if at >= sl.stop:
                    break
    finally:
        for fh in handles.values():
            fh.close()
