"""A rank's streamed shard: the same global order for any world size, a resumable position, decoding
transforms in workers, and bounded memory on a shard far larger than the rank may hold."""

import gc
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest
import torch

from sparkml_dist import ConfigurationError
from sparkml_dist.runner import checkpoint
from sparkml_dist.runner.data import loader
from sparkml_dist.runner.data.sample_order import rank_streams
from sparkml_dist.runner.data.shard import Shard
from sparkml_dist.runner.data.sources import TableSource
from tests.support import png


def _streams(sizes):
    """One table per stream, each row's ``id`` unique over all streams."""
    out, start = [], 0
    for n in sizes:
        ids = np.arange(start, start + n)
        out.append(pa.table({"id": pa.array(ids, pa.int64()), "x": pa.array(ids * 0.5)}))
        start += n
    return out


def _shards(tables, world, chunk_rows=7):
    """The shards of ``world`` data ranks over the streams, as run_with_data deals them."""
    sizes = [t.num_rows for t in tables]
    return [
        Shard(
            None,
            source=TableSource(
                {c: tables[c] for c in rank_streams(r, world, len(tables))}, chunk_rows=chunk_rows
            ),
            sizes=sizes,
            data_rank=r,
            data_world=world,
        )
        for r in range(world)
    ]


def _steps(world, tables, global_batch, seed=3, **options):
    """Per global step, the sorted ids every rank trained on together."""
    loaders = [
        s.dataloader(global_batch_size=global_batch, columns=["id"], seed=seed, window_rows=10, **options)
        for s in _shards(tables, world)
    ]
    per_rank = [[b[0].tolist() for b in lo] for lo in loaders]
    assert len({len(p) for p in per_rank}) == 1  # every rank the same number of steps
    assert all(len(b) == global_batch // world for p in per_rank for b in p[:-1])
    assert len({len(p[-1]) for p in per_rank}) == 1  # the last batch: the same size on every rank
    return [sorted(sum((p[s] for p in per_rank), [])) for s in range(len(per_rank[0]))]


def test_the_samples_of_every_global_step_do_not_depend_on_the_world_size():
    tables = _streams([26, 25, 25, 24])  # streams differ by at most one row, as run_with_data deals them
    one, two, four = (_steps(w, tables, 8) for w in (1, 2, 4))
    assert one == two == four and len(one) == 13  # ceil(26 / (8 / 4)) steps
    seen = sorted(sum(one, []))
    assert set(seen) == set(range(100))  # every sample in the epoch
    # the last step takes positions 24 and 25 of every stream: the 3 shorter ones fill theirs from
    # their start, 1 + 1 + 2 rows given again
    assert len(seen) - 100 == 4
    other_seed = _steps(2, tables, 8, seed=4)
    assert other_seed != two and set(sum(other_seed, [])) == set(seen)
    plain = _steps(2, tables, 8, shuffle=False)
    assert plain[0] == [0, 1, 26, 27, 51, 52, 76, 77]  # stream order, two positions a stream a step


def _epoch(world, rows, batch, **options):
    """Per rank: the ids of each batch of one epoch, and the loader's padding count per batch."""
    sizes = [rows // world + (r < rows % world) for r in range(world)]
    out = []
    for shard in _shards(_streams(sizes), world):
        lo = shard.dataloader(batch, ["id"], seed=2, **options)
        batches, padding = [], []
        for (ids,) in lo:
            batches.append(ids.tolist())
            padding.append(lo.padding)
        out.append((batches, padding))
    return out


@pytest.mark.parametrize("rows", [4000, 4001])
def test_every_row_once_an_epoch_with_a_shorter_last_batch_and_a_marked_repeat(rows):
    ranks = _epoch(2, rows, 256)
    assert len({len(b) for b, _ in ranks}) == 1 == len({len(b[-1]) for b, _ in ranks})
    assert all(len(x) == 256 for b, _ in ranks for x in b[:-1]) and len(ranks[0][0][-1]) < 256
    seen = [i for b, _ in ranks for x in b for i in x]
    assert sorted(set(seen)) == list(range(rows))  # every row, and only these
    for batches, padding in ranks:  # at most one repeat per rank, counted, at the batch's end
        mine = [i for x in batches for i in x]
        assert len(mine) - len(set(mine)) == sum(padding) <= 1 and sum(padding[:-1]) == 0
        if padding[-1]:
            assert batches[-1][-1] in mine[: -padding[-1]]
    assert len(seen) - rows == (rows % 2)
    # the full-batch option: every batch 256 rows, the last filled from the epoch's start (4,096 an epoch)
    full = _epoch(2, rows, 256, pad_last=True)
    assert [len(x) for b, _ in full for x in b] == [256] * 16
    assert sum(p for _, pad in full for p in pad) == 4096 - rows
    assert [len(b) for b, _ in _epoch(2, rows, 256, drop_last=True)] == [7, 7]  # 7 full, rest dropped


def test_an_epoch_changes_the_order_not_the_samples_and_batch_size_is_per_rank():
    (s,) = _shards(_streams([40]), 1)
    lo = s.dataloader(8, ["id", "x"], seed=1, window_rows=16)
    first, second = [b[0].tolist() for b in lo], [b[0].tolist() for b in lo]
    assert sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(40)) and first != second
    ids, x = next(iter(lo))
    assert ids.dtype == torch.int64 and x.dtype == torch.float32 and torch.equal(x, ids * 0.5)
    assert len(lo) == s.steps_per_epoch(8) == 5
    with pytest.raises(ConfigurationError, match="batch_size"):
        s.dataloader(8, ["id"], global_batch_size=8)
    with pytest.raises(ConfigurationError, match="multiple of the 4 streams"):
        _shards(_streams([5, 5, 5, 5]), 2)[0].dataloader(global_batch_size=6, columns=["id"])


def _resume_ids(before_world, after_world, stop_after):
    tables = _streams([24, 24, 24, 24])
    first = [
        s.dataloader(global_batch_size=8, columns=["id"], seed=5, window_rows=10)
        for s in _shards(tables, before_world)
    ]
    seen = []
    for lo in first:
        it = iter(lo)
        seen += sum((next(it)[0].tolist() for _ in range(stop_after)), [])
    state = json.loads(json.dumps(first[0].state_dict()))  # a few integers, the same on every rank
    assert state["step"] == stop_after and {lo.state_dict()["step"] for lo in first} == {stop_after}
    later = [
        s.dataloader(global_batch_size=8, columns=["id"], seed=5, window_rows=10)
        for s in _shards(tables, after_world)
    ]
    for lo in later:
        lo.load_state_dict(state)
        lo.set_epoch(0)  # the usual per-epoch call keeps the restored step
        seen += sum((b[0].tolist() for b in lo), [])
    return seen


@pytest.mark.parametrize("before,after", [(4, 4), (4, 2), (2, 1)])
def test_a_resumed_epoch_sees_every_sample_exactly_once_on_the_same_or_another_world_size(before, after):
    assert sorted(_resume_ids(before, after, stop_after=5)) == list(range(96))


def test_a_position_for_other_data_or_a_batch_that_does_not_divide_it_is_refused():
    (a,) = _shards(_streams([30]), 1)
    state = a.dataloader(6, ["id"]).state_dict() | {"step": 1}
    with pytest.raises(ConfigurationError, match="rows=30, this loader has 31"):
        _shards(_streams([31]), 1)[0].dataloader(6, ["id"]).load_state_dict(state)
    with pytest.raises(ConfigurationError, match="global_batch_size=6"):
        a.dataloader(4, ["id"]).load_state_dict(state)


def test_checkpoint_save_and_load_carry_the_loaders_position(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    (s,) = _shards(_streams([50]), 1)
    whole = [b[0].tolist() for b in s.dataloader(5, ["id"], seed=2)]
    lo = s.dataloader(5, ["id"], seed=2)
    it = iter(lo)
    for _ in range(4):
        next(it)
    checkpoint.save({"w": torch.ones(2)}, step=3, directory=str(tmp_path))
    del it, lo
    gc.collect()
    state = checkpoint.load(directory=str(tmp_path))  # before the loader exists, as on a restart
    assert set(state) == {"w"} and torch.equal(state["w"], torch.ones(2))
    resumed = s.dataloader(5, ["id"], seed=2)
    assert resumed.state_dict()["step"] == 4
    assert [b[0].tolist() for b in resumed] == whole[4:]
    assert [b[0].tolist() for b in resumed] != whole  # the next epoch starts over, in a new order
    loader._pending.clear()


def _png_table(n, side=6):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(n, side, side), dtype=np.uint8)
    table = pa.table(
        {
            "image": pa.array([png.encode(im) for im in images], pa.binary()),
            "label": pa.array(images.reshape(n, -1).sum(axis=1) % 2, pa.int64()),
        }
    )
    return table, images


def decode_batch(values):
    """A transform as a user writes it: PNG bytes in, a float tensor batch out."""
    assert isinstance(values["image"][0], bytes)
    images = np.stack([png.decode(b) for b in values["image"]]).astype(np.float32) / 255.0
    return torch.from_numpy(images), torch.from_numpy(values["label"])


def test_binary_columns_reach_a_transform_as_bytes_and_decode_in_workers_in_order():
    table, images = _png_table(64)
    s = Shard(table, [64], 0)
    with pytest.raises(ConfigurationError, match="'image' holds binary values, not numbers.*transform=fn"):
        s.dataloader(8, ["image", "label"])
    with pytest.raises(ConfigurationError, match="'image' holds binary"):
        s.to_torch(["image"])
    inline = list(s.dataloader(8, ["image", "label"], seed=1, transform=decode_batch))
    pool = s.dataloader(8, ["image", "label"], seed=1, transform=decode_batch, num_workers=2)
    in_workers = list(pool)
    pool.close()
    assert len(inline) == len(in_workers) == 8
    for (xa, ya), (xb, yb) in zip(inline, in_workers):
        assert xa.shape == (8, 6, 6) and torch.equal(xa, xb) and torch.equal(ya, yb)
    got = torch.cat([x for x, _ in inline]).numpy()
    want = np.sort(images.reshape(64, -1).astype(np.float32) / 255.0, axis=0)
    assert np.array_equal(np.sort(got.reshape(64, -1), axis=0), want)  # every image once, intact


def _spill_shard(workdir, rows):
    """A task's spill of ``rows`` rows (50 float64 columns and a label) and the rank's manifest."""
    from sparkml_dist.group_rows import GROUP_COL
    from sparkml_dist.runner.data.feeding import CHUNK_ROWS, Spill, route
    from sparkml_dist.runner.data.sources import write_manifest

    def batches():  # the task's rows, as Spark hands them
        rng = np.random.default_rng(0)
        for lo in range(0, rows, 20000):
            n = min(20000, rows - lo)
            cols = {f"f{j}": rng.random(n) for j in range(50)}
            cols["label"] = np.arange(lo, lo + n)
            cols[GROUP_COL] = np.zeros(n, np.int32)
            yield pa.record_batch(cols)

    spill = Spill(os.path.join(workdir, "shard.arrow"), [0], [rows])
    route(batches(), [spill])
    spill.close()
    spill.verify(0)
    manifest = os.path.join(workdir, "shard.json")
    write_manifest(
        manifest,
        kind="ipc",
        file=spill.path,
        chunk_rows=CHUNK_ROWS,
        sizes=[rows],
        streams=[0],
        data_rank=0,
        data_world=1,
    )
    return manifest, spill.path


_BOUNDED = textwrap.dedent(
    """
    import json, os, resource, sys
    from sparkml_dist.errors import ConfigurationError
    from sparkml_dist.runner.data import shard as data

    limit_mib = int(sys.argv[1])
    data.load_from_env()
    s = data.shard()
    cols = [f"f{j}" for j in range(50)]
    next(iter(s.dataloader(1000, cols[:2])))  # warm up (imports, thread pool) before the limit
    def rss():
        return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024
    used = int(open("/proc/self/status").read().split("VmData:")[1].split()[0]) * 1024
    resource.setrlimit(resource.RLIMIT_DATA, (used + limit_mib * 2**20, resource.RLIM_INFINITY))
    base, peak = rss(), 0
    refused = ""
    try:
        s.to_torch(cols)
    except ConfigurationError as e:
        refused = str(e)
    n = 0
    for epoch in range(2):
        for step, (*xs, y) in enumerate(s.dataloader(1000, cols + ["label"], seed=epoch, read_ahead=1)):
            n += len(y)
            if step % 25 == 0:
                peak = max(peak, rss())
    print(json.dumps(dict(rows=n, growth=peak - base, refused=refused)))
    """
)


def test_a_shard_five_times_the_memory_limit_streams_in_bounded_memory(tmp_path):
    rows, limit_mib = 1_000_000, 80  # 1M x 51 x 8 bytes ~ 390 MiB: ~5x the rank's 80 MiB of room
    manifest, spill = _spill_shard(str(tmp_path), rows)
    shard_bytes = os.path.getsize(spill)
    out = subprocess.run(
        [sys.executable, "-c", _BOUNDED, str(limit_mib)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1", "SPARKML_DIST_SHARD": manifest},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert shard_bytes > 4.5 * limit_mib * 2**20 and got["rows"] == 2 * rows  # two whole epochs
    assert got["growth"] < limit_mib * 2**20, got  # bounded by the windows, not the shard
    assert "shard().dataloader(batch_size, columns)" in got["refused"]  # to_torch names the streaming API
    assert not os.path.exists(spill)  # the spill left the directory as soon as the rank opened it


def _parquet_shards(tmp_path, world, streams=4, rows=10_000):
    """The shards of ``world`` ranks over ``streams`` contiguous ranges of a Parquet file of
    ``rows`` ids in row groups of 3,000, as run_with_data deals a plain scan."""
    import pyarrow.parquet as pq

    from sparkml_dist.runner.data.sources import ParquetSource

    path = str(tmp_path / "ids.parquet")
    if not os.path.exists(path):
        pq.write_table(pa.table({"id": np.arange(rows)}), path, row_group_size=3000)
    sizes = [rows // streams + (c < rows % streams) for c in range(streams)]
    starts = np.r_[0, np.cumsum(sizes)]
    parts = {}
    for c in range(streams):  # each stream's slices of the row groups it spans
        lo, hi, cut = int(starts[c]), int(starts[c + 1]), []
        for g in range(lo // 3000, -(-hi // 3000)):
            a, b = max(lo, g * 3000), min(hi, (g + 1) * 3000)
            cut.append([path, g, a - g * 3000, b - g * 3000])
        parts[c] = cut
    schema = pa.schema([("id", pa.int64())])
    return [
        Shard(
            None,
            source=ParquetSource(
                ["id"], schema, {c: parts[c] for c in rank_streams(r, world, streams)}, chunk_rows=1000
            ),
            sizes=sizes,
            data_rank=r,
            data_world=world,
        )
        for r in range(world)
    ]


def test_parquet_streams_read_each_row_group_forward_once_per_epoch_in_the_same_global_order(tmp_path):
    per_world = {}
    for world in (1, 2):
        shards = _parquet_shards(tmp_path, world)
        loaders = [
            s.dataloader(global_batch_size=40, columns=["id"], seed=9, window_rows=1500) for s in shards
        ]
        per_rank = [[b[0].tolist() for b in lo] for lo in loaders]
        per_world[world] = [sorted(sum((p[s] for p in per_rank), [])) for s in range(len(per_rank[0]))]
        assert sorted(sum(per_world[world], [])) == list(range(10_000))  # every id once
        slices = sum(len(src._parts[c]) for src in (s._source for s in shards) for c in src.streams)
        assert sum(s._source.opened for s in shards) == slices  # each row-group slice read once, forward
    assert per_world[1] == per_world[2]
    first = per_world[1][0]
    assert first != sorted(first) or first[-1] - first[0] > 40  # shuffled, not the files' order


def _resizable(tables, world, rank):
    """Rank ``rank`` of ``world``'s shard, able to re-deal itself as a world that changes in place does."""
    sizes = [t.num_rows for t in tables]

    def reopen(streams):
        return TableSource({c: tables[c] for c in streams}, chunk_rows=7)

    return Shard(
        None, source=reopen(rank_streams(rank, world, len(tables))), sizes=sizes, data_rank=rank,
        data_world=world, reopen=reopen,
    )  # fmt: skip


def test_a_world_that_shrinks_and_grows_back_in_place_trains_the_same_global_batches():
    """Two ranks train 3 steps; rank 1 is lost and rank 0 goes on alone from the position of its
    last step (its loader re-dealt: every stream, the whole global batch), 2 steps; then a world of
    two again from there (a new rank 1 given rank 0's position, as elastic.run's state sync does).
    Every step's global batch is the one a fixed world trains, and the epoch gives every row once."""
    tables = _streams([13, 12, 12, 12])
    fixed = _steps(2, tables, 8)
    two = [_resizable(tables, 2, r) for r in (0, 1)]
    loaders = [s.dataloader(global_batch_size=8, columns=["id"], seed=3, window_rows=10) for s in two]
    its = [iter(lo) for lo in loaders]
    steps = [sorted(next(its[0])[0].tolist() + next(its[1])[0].tolist()) for _ in range(3)]
    two[0].redeal(0, 1)  # rank 1 lost: rank 0 of a world of one
    assert two[0].streams == [0, 1, 2, 3] and loaders[0].batch_size == 8
    loaders[0].load_state_dict(loaders[0].state_dict())  # the state's restore to its last commit
    it = iter(loaders[0])  # elastic.run calls the function again: a new iter() from the position
    steps += [sorted(next(it)[0].tolist()) for _ in range(2)]
    position = loaders[0].state_dict()
    two[0].redeal(0, 2)
    joiner = _resizable(tables, 2, 1).dataloader(global_batch_size=8, columns=["id"], seed=3, window_rows=10)
    joiner.load_state_dict(position)
    loaders[0].load_state_dict(position)  # the state's restore at the regrow
    rest = zip(loaders[0], joiner)
    steps += [sorted(a[0].tolist() + b[0].tolist()) for a, b in rest]
    assert steps == fixed and len(steps) == 7
    assert sorted(set(sum(steps, []))) == list(range(49))


def test_a_global_batch_that_a_smaller_world_cannot_share_is_refused_when_the_loader_is_made(monkeypatch):
    from sparkml_dist.runner import protocol

    monkeypatch.setenv(protocol.RESIZE_ENV, "2:30")
    shard = _resizable(_streams([12, 12, 12, 12]), 4, 0)
    with pytest.raises(ConfigurationError, match=r"global_batch_size=8 .* world of 3 ranks.*e\.g\. 12"):
        shard.dataloader(global_batch_size=8, columns=["id"])
    assert shard.dataloader(global_batch_size=24, columns=["id"]).batch_size == 6
