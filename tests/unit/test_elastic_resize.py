"""``elastic.run``'s generations of another size (``executor_loss="replace"`` with ``min_np``):
real rank processes, a real ``TCPStore`` served by this process (as the driver serves it) and real
gloo groups; no Spark.  A rank is lost, the others form a smaller generation after ``resize_wait``
(renumbered by the ranks they started as), then the lost rank's replacement registers and the
others let it in at their next "commit" (:meth:`Membership.joiners`): a generation of the whole
world again, every rank back at the number it started with."""

import datetime
import multiprocessing as mp
import os
import time

import pytest

from sparkml_dist.runner import protocol

WORLD, WAIT_S = 3, 1.0


def _env(port: int, rank: int, replaces: bool = False) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        **{protocol.TIMEOUT_ENV: "60", protocol.RESIZE_ENV: f"1:{WAIT_S}"},
    )
    if replaces:
        os.environ[protocol.REPLACES_ENV] = "1"


def _sum() -> int:
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return int(t.item())


def _survivor(port: int, rank: int, lost: int, marks: str, out) -> None:
    import torch.distributed as dist

    from sparkml_dist.runner.elastic import membership

    _env(port, rank)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore("test/g0", store), rank=rank, world_size=WORLD)
    member = membership.current()
    dist.barrier()
    if rank == lost:
        os._exit(0)  # lost: its peers' group is broken from now on
    seen = [(member.generation, member.rank, member.world)]
    started = time.monotonic()
    member.reform()  # what elastic.run does when a collective failed
    seen.append((member.generation, member.rank, member.world, _sum(), round(time.monotonic() - started, 1)))
    open(os.path.join(marks, f"shrunk-{rank}"), "w").close()
    end = time.monotonic() + 60
    while not member.joiners():  # a commit: is anyone waiting to join?
        assert time.monotonic() < end, "the replacement never registered"
        time.sleep(0.1)
    member.reform()
    seen.append((member.generation, member.rank, member.world, _sum(), os.environ["RANK"]))
    out.put((rank, seen))


def _joiner(port: int, rank: int, out) -> None:
    import torch.distributed as dist

    from sparkml_dist.runner.elastic import membership

    _env(port, rank, replaces=True)
    membership.join_on_init()
    dist.init_process_group("gloo")  # joins the run's next generation instead
    member = membership.current()
    out.put(("joiner", [(member.generation, member.rank, member.world, _sum(), os.environ["WORLD_SIZE"])]))


@pytest.mark.parametrize("lost", [2, 0])
def test_the_world_shrinks_after_resize_wait_and_grows_back_at_a_commit(tmp_path, lost):
    """``lost`` = 0: the survivors (started as 1 and 2) are ranks 0 and 1 of the smaller
    generation, and the replacement of rank 0 is rank 0 again once the world is whole."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    port = store.port
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_survivor, args=(port, r, lost, str(tmp_path), out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    survivors = [r for r in range(WORLD) if r != lost]
    end = time.monotonic() + 90
    while not all((tmp_path / f"shrunk-{r}").exists() for r in survivors):
        assert time.monotonic() < end, "the survivors never formed a smaller generation"
        time.sleep(0.1)
    joiner = ctx.Process(target=_joiner, args=(port, lost, out))
    joiner.start()
    got = dict(out.get(timeout=90) for _ in range(WORLD))
    for p in procs + [joiner]:
        p.join(30)
    for new_rank, started_as in enumerate(survivors):
        first, shrunk, grown = got[started_as]
        assert first == (0, started_as, WORLD)
        assert shrunk[:4] == (1, new_rank, WORLD - 1, WORLD - 1), shrunk  # renumbered, 2 ranks
        assert shrunk[4] >= WAIT_S  # it waited resize_wait for the lost rank first
        assert grown == (2, started_as, WORLD, WORLD, str(started_as)), grown  # its own number again
    assert got["joiner"] == [(2, lost, WORLD, WORLD, str(WORLD))]


def test_without_min_np_a_generation_waits_for_the_whole_world(tmp_path, monkeypatch):
    """No ``RESIZE_ENV``: one registered rank of two never forms a generation; it times out
    naming how many came (today's rule, unchanged)."""
    import torch.distributed as dist

    from sparkml_dist import errors
    from sparkml_dist.runner.elastic import membership

    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    monkeypatch.setenv(protocol.TIMEOUT_ENV, "2")
    monkeypatch.delenv(protocol.RESIZE_ENV, raising=False)
    member = membership.Membership(replaces=False)
    assert member.min_np is None
    store.add(membership.GEN_KEY, 1)  # a loss moved the run to generation 1
    with pytest.raises(errors.WorkerError, match=r"generation 1 \(1 of 2 came\)"):
        member.join("gloo")
