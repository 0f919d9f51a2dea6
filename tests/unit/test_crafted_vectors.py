"""A Spark ML vector column read in place from Parquet files that someone crafted: every struct is
checked as Spark's VectorUDT checks it, and against the width the driver read, before anything is
allocated for the rows; the refusal names the column, the file and the row group (issue 52).

The files are real Parquet files written by pyarrow with the struct Spark stores a vector as
(type tinyint: 0 sparse, 1 dense; size int; indices array<int>; values array<double>)."""

import resource
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkml_dist import ConfigurationError
from sparkml_dist.runner.data import parquet_split

VECTOR = pa.struct(
    [
        pa.field("type", pa.int8(), nullable=False),
        pa.field("size", pa.int32()),
        pa.field("indices", pa.list_(pa.int32())),
        pa.field("values", pa.list_(pa.float64())),
    ]
)
GOOD = [
    {"type": 1, "size": None, "indices": None, "values": [1.0, 2.0, 3.0]},
    {"type": 0, "size": 3, "indices": [0, 2], "values": [5.0, 6.0]},
    None,
]


def _split(tmp_path, rows, width=3):
    """A one-file split of column ``v`` holding ``rows`` (two row groups: the last row alone)."""
    path = tmp_path / "part-0.parquet"
    table = pa.table({"v": pa.array(rows, VECTOR)})
    pq.write_table(table, path, row_group_size=max(1, len(rows) - 1))
    field = pa.field(
        "v",
        pa.list_(
            pa.float64(),
        ),
        nullable=True,
    )
    if width is not None:
        field = field.with_metadata({parquet_split.WIDTH_KEY: str(width).encode()})
    meta = pq.ParquetFile(path).metadata
    slices = tuple(
        parquet_split.Slice(str(path), g, 0, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)
    )
    return parquet_split.ParquetSplit(("v",), pa.schema([field]), (slices,), (len(rows),)), str(path)


def _read(split):
    return pa.Table.from_batches(list(parquet_split.read(split, 0))).column("v").to_pylist()


def test_genuine_dense_sparse_and_null_vectors_read_as_vector_to_array_gives_them(tmp_path):
    split, _ = _split(tmp_path, GOOD)
    assert _read(split) == [[1.0, 2.0, 3.0], [5.0, 0.0, 6.0], None]


def _v(kind, size=None, indices=None, values=None):
    return {"type": kind, "size": size, "indices": indices, "values": values}


CRAFTED = {  # case: (the crafted row, what the refusal says)
    "one index for two values": (_v(0, 3, [2], [7.0, 9.0]), "1 indices for 2 values"),
    "a type code of 7": (_v(7, values=[1.0, 2.0, 3.0]), "type code of 7"),
    "a size of 2**31 - 1 in a 3-wide column": (
        _v(0, 2**31 - 1, [0], [1.0]),
        "2147483647 entries in a column the driver read as 3 wide",
    ),
    "an index out of range": (_v(0, 3, [0, 3], [1.0, 2.0]), "index outside its size"),
    "a negative index": (_v(0, 3, [-1, 1], [1.0, 2.0]), "index outside its size"),
    "unsorted indices": (_v(0, 3, [2, 0], [1.0, 2.0]), "not strictly increasing"),
    "a repeated index": (_v(0, 3, [1, 1], [1.0, 2.0]), "not strictly increasing"),
    "a sparse vector without a size": (_v(0, None, [0], [1.0]), "no size"),
    "a sparse vector without indices": (_v(0, 3, None, [1.0]), "no indices"),
    "a vector without values": (_v(1), "no values"),
    "a dense row of another width": (
        _v(1, values=[1.0, 2.0]),
        "2 entries in a column the driver read as 3 wide",
    ),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_vector_is_refused_naming_the_column_the_file_and_the_row_group(tmp_path, case):
    row, says = CRAFTED[case]
    split, path = _split(tmp_path, GOOD[:2] + [row])  # the crafted row alone in row group 1
    with pytest.raises(ConfigurationError) as err:
        _read(split)
    text = str(err.value)
    assert says in text, text
    assert f"column 'v' of {path}, row group 1" in text and "VectorUDT refuses it" in text


def test_a_huge_declared_size_is_refused_without_a_width_before_anything_is_allocated(tmp_path):
    """No width from the driver: the cap of a dense row still holds; checked in a process whose
    address space could not hold the 16 GiB the row declares."""
    split, _ = _split(tmp_path, [{"type": 0, "size": 2**31 - 1, "indices": [5], "values": [1.0]}], width=None)
    with pytest.raises(ConfigurationError, match="2147483647 entries, more than the 65536"):
        _read(split)
    code = textwrap.dedent(
        f"""
        import resource, pyarrow as pa, pyarrow.parquet as pq
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        from sparkml_dist import ConfigurationError
        from sparkml_dist.runner.data import parquet_split
        sl = parquet_split.Slice({str(tmp_path / "part-0.parquet")!r}, 0, 0, 1)
        schema = pa.schema([pa.field("v", pa.list_(pa.float64()))])
        split = parquet_split.ParquetSplit(("v",), schema, ((sl,),), (1,))
        try:
            list(parquet_split.read(split, 0))
        except ConfigurationError as exc:
            print("refused:", exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "refused:" in out.stdout and "MemoryError" not in out.stderr, out.stderr[-2000:]
    assert resource.getrlimit(resource.RLIMIT_AS)  # this process's own limit untouched


def test_the_check_is_vectorized_over_a_batch_of_many_genuine_rows(tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(5000):
        idx = sorted(rng.choice(16, size=3, replace=False).tolist())
        rows.append(
            {"type": 0, "size": 16, "indices": idx, "values": [1.0, 2.0, 3.0]}
            if i % 2
            else {"type": 1, "size": None, "indices": None, "values": [float(i)] * 16}
        )
    split, _ = _split(tmp_path, rows, width=16)
    got = _read(split)
    assert len(got) == 5000 and got[0] == [0.0] * 16 and sum(got[1]) == 6.0
