"""sparkml_dist.runner.checkpoint: atomic saves by rank 0, verified weights-only loads, exact resume."""

import json
import os

import pytest
import torch

from sparkml_dist import CollectionError, ConfigurationError, WorkerError
from sparkml_dist.runner import BarrierRunner, checkpoint
from tests.support import runner_helpers as h

pytestmark = pytest.mark.slow  # starts rank processes or waits on timeouts: not in make test-fast


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    clean = BarrierRunner(-2, timeout=120, checkpoint_dir=str(tmp_path / "clean")).run(
        h.train_with_checkpoints
    )
    assert clean["resumed_from"] == 0
    resumable = BarrierRunner(-2, timeout=120, checkpoint_dir=str(tmp_path / "crash"))
    with pytest.raises(WorkerError) as err:
        resumable.run(h.train_with_checkpoints, crash_at=7)  # rank 1 dies after the step-5 checkpoint
    assert err.value.rank == 1 and err.value.exit_code == 3
    assert checkpoint.latest_step(str(tmp_path / "crash")) == 5
    resumed = resumable.run(h.train_with_checkpoints)
    assert resumed["resumed_from"] == 6
    assert torch.equal(resumed["weight"], clean["weight"]) and torch.equal(resumed["bias"], clean["bias"])
    kept = sorted(os.listdir(tmp_path / "crash"))
    assert kept == ["LATEST", "step-000000000005.pt", "step-000000000008.pt", "step-000000000011.pt"]


def test_ranks_that_do_not_see_the_same_checkpoints_are_refused(tmp_path):
    shared, other = str(tmp_path / "shared"), str(tmp_path / "host-b")
    assert BarrierRunner(-2, timeout=120).run(h.resume_from, shared, shared) == 5
    with pytest.raises(WorkerError) as err:  # rank 1's "host" has its own, empty, local directory
        BarrierRunner(-2, timeout=120).run(h.resume_from, shared, other)
    text = str(err.value) + (err.value.worker_traceback or "")
    assert "ranks [0] resume from step 5; ranks [1] found no checkpoint" in text
    assert "storage every host shares" in text


def test_a_half_written_checkpoint_never_becomes_the_latest(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    d = str(tmp_path)
    checkpoint.save({"w": torch.ones(3), "step": 1}, 1, directory=d)
    # what a crash mid-save leaves behind: a temporary file and a truncated checkpoint, LATEST untouched
    (tmp_path / "step-000000000002.pt.tmp-dead").write_bytes(b"\x80\x02partial")
    (tmp_path / "step-000000000002.pt").write_bytes(b"\x80\x02trunc")
    state = checkpoint.load(d)
    assert state["step"] == 1 and torch.equal(state["w"], torch.ones(3))


def test_tampered_or_code_carrying_files_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    d = str(tmp_path)
    checkpoint.save({"w": torch.zeros(2)}, 3, directory=d)
    path = tmp_path / "step-000000000003.pt"
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF  # one flipped byte
    path.write_bytes(bytes(blob))
    with pytest.raises(CollectionError, match="does not match its LATEST record"):
        checkpoint.load(d)

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    checkpoint.save({"payload": Evil()}, 4, directory=d)  # a valid LATEST record for a hostile file
    with pytest.raises(Exception, match="(?i)weights.only|unsupported|global"):
        checkpoint.load(d)
    assert not marker.exists()


def test_only_rank_0_writes_and_a_directory_is_required(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert checkpoint.save({"w": torch.ones(1)}, 0, directory=str(tmp_path)) is None
    assert os.listdir(tmp_path) == []
    monkeypatch.delenv(checkpoint.DIR_ENV, raising=False)
    with pytest.raises(ConfigurationError, match="pass checkpoint_dir"):
        checkpoint.load()
    with pytest.raises(ConfigurationError, match="step must be an integer"):
        checkpoint.save({}, -1, directory=str(tmp_path))
    assert checkpoint.load(str(tmp_path / "none")) is None


def test_max_restarts_resumes_from_the_checkpoint_with_the_exact_result(tmp_path):
    clean = BarrierRunner(-2, timeout=120, checkpoint_dir=str(tmp_path / "clean")).run(
        h.train_with_checkpoints
    )
    lines = []
    out = BarrierRunner(
        -2, timeout=120, max_restarts=2, checkpoint_dir=str(tmp_path / "r"), log_sink=lines.append
    ).run(h.train_with_checkpoints, crash_at=7, crash_once_marker=str(tmp_path / "crashed"))
    assert out["resumed_from"] == 6
    assert torch.equal(out["weight"], clean["weight"]) and torch.equal(out["bias"], clean["bias"])
    assert any("attempt 1 failed: rank 1 exited with code 3" in ln for ln in lines)


def test_an_identical_failure_stops_restarts_early_and_every_cause_is_listed(tmp_path):
    with pytest.raises(WorkerError) as err:
        BarrierRunner(-2, timeout=120, max_restarts=5).run(h.fail_on, 0, "raise")
    text = str(err.value)
    assert "failed 2 times, restarts stopped (the same failure repeated identically" in text
    assert text.count("injected failure at step 2") >= 2 and err.value.rank == 0
    with pytest.raises(WorkerError) as err:
        BarrierRunner(-2, timeout=120, max_restarts=2).run(h.fail_differently, str(tmp_path / "n"))
    text = str(err.value)
    assert "failed 3 times, restarts stopped (max_restarts=2 used up)" in text
    assert all(f"lost a disk on attempt {i}" in text for i in (1, 2, 3))
    with pytest.raises(ConfigurationError, match="max_restarts must be an integer >= 0"):
        BarrierRunner(-2, max_restarts=-1)


def test_due_marks_every_nth_step():
    assert [s for s in range(250) if checkpoint.due(s)] == [99, 199]
    assert [s for s in range(7) if checkpoint.due(s, every=3)] == [2, 5]
    assert not any(checkpoint.due(s, every=0) for s in range(10))


def test_timeout_bounds_the_whole_run_restarts_included(tmp_path):
    import time

    from sparkml_dist import RunTimeoutError

    t = time.time()
    with pytest.raises(RunTimeoutError):
        BarrierRunner(-2, timeout=12, max_restarts=100).run(h.fail_differently, str(tmp_path / "n"))
    assert time.time() - t < 25
    # it stopped on the clock, not on the count (on a loaded host, even before a rank's first attempt)
    attempts = int((tmp_path / "n").read_text()) if (tmp_path / "n").exists() else 0
    assert attempts < 100


@pytest.mark.parametrize("which", ["LATEST", "step"])
@pytest.mark.parametrize("kind", ["fifo", "dev_zero_link"])
def test_a_fifo_or_a_dev_zero_link_as_a_checkpoint_file_is_refused_at_once(
    tmp_path, monkeypatch, which, kind
):
    import time

    monkeypatch.setenv("RANK", "0")
    d = str(tmp_path)
    checkpoint.save({"w": torch.ones(3)}, 5, directory=d)
    target = tmp_path / ("LATEST" if which == "LATEST" else "step-000000000005.pt")
    if which == "step":  # the record promises a huge file: the read must still stop at once
        record = json.loads((tmp_path / "LATEST").read_text())
        (tmp_path / "LATEST").write_text(json.dumps({**record, "bytes": 1 << 40}))
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    else:
        os.symlink("/dev/zero", target)
    start = time.monotonic()
    with pytest.raises(Exception, match="not a regular file|symbolic link"):
        checkpoint.load(d)
    assert time.monotonic() - start < 5


def test_a_torch_whose_weights_only_loads_run_code_is_refused_naming_the_fix():
    checkpoint._check_torch("2.6.0+cpu")
    checkpoint._check_torch("2.13.0")
    with pytest.raises(ConfigurationError, match=r"torch 2\.5\.1.*CVE-2025-32434.*2\.6 or later"):
        checkpoint._check_torch("2.5.1")


def _tied_state():
    """A real model's state (an OrderedDict with _metadata, a tied weight) and an optimizer's."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 8)
    head = torch.nn.Linear(8, 50, bias=False)
    head.weight = emb.weight  # tied: one storage under two names
    model = torch.nn.Sequential(emb, torch.nn.ReLU(), head)
    opt = torch.optim.Adam(model.parameters())
    model(torch.arange(10)).sum().backward()
    opt.step()
    return model, opt


def test_a_background_save_copies_then_writes_the_same_file_off_the_training_path(tmp_path, monkeypatch):
    import threading

    monkeypatch.setenv("RANK", "0")
    model, opt = _tied_state()
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": 4, "note": ["a", 1.5]}
    state["head"] = model[2].weight  # a Parameter itself, tied to the state's tensors
    checkpoint.save(state, 4, directory=str(tmp_path / "sync"))
    expected = {k: v.clone() for k, v in model.state_dict().items()}

    gate, puts = threading.Event(), []
    real_put = checkpoint._put

    def held_put(fs, path, data):  # the write waits until the test lets it go
        assert gate.wait(30), "the write was never released"
        puts.append(os.path.basename(path))
        real_put(fs, path, data)

    monkeypatch.setattr(checkpoint, "_put", held_put)
    written = checkpoint.save(state, 4, directory=str(tmp_path / "async"), blocking=False)
    # save returned while its write is held: the training path did not wait for the write
    assert written.endswith("step-000000000004.pt") and puts == [] and not gate.is_set()
    with torch.no_grad():  # training goes on and changes the live tensors
        for p in model.parameters():
            p.add_(1.0)
    gate.set()
    assert checkpoint.wait() == 4 and puts == ["step-000000000004.pt", "LATEST"]
    assert checkpoint.wait() is None  # nothing in flight any more
    sync = (tmp_path / "sync" / "step-000000000004.pt").read_bytes()
    assert (tmp_path / "async" / "step-000000000004.pt").read_bytes() == sync  # byte for byte
    back = checkpoint.load(str(tmp_path / "async"))
    assert all(torch.equal(back["model"][k], v) for k, v in expected.items())
    assert back["model"]["0.weight"].untyped_storage().data_ptr() == (
        back["model"]["2.weight"].untyped_storage().data_ptr()
    )  # still tied after the copy
    assert back["note"] == ["a", 1.5] and back["step"] == 4
    assert isinstance(back["head"], torch.nn.Parameter) and torch.equal(back["head"], expected["2.weight"])


def test_background_writes_never_overlap_and_a_failed_one_leaves_the_previous_latest(tmp_path, monkeypatch):
    import threading
    import time

    monkeypatch.setenv("RANK", "0")
    d = str(tmp_path)
    active, most = [0], [0]
    lock = threading.Lock()
    real_put = checkpoint._put

    def counted_put(folder, name, data):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            time.sleep(0.2)
            if "step-000000000003" in name:
                raise OSError(28, "No space left on device")
            real_put(folder, name, data)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(checkpoint, "_put", counted_put)
    checkpoint.save({"w": torch.full((1000,), 1.0)}, 1, directory=d, blocking=False)
    checkpoint.save({"w": torch.full((1000,), 2.0)}, 2, directory=d, blocking=False)  # waits for 1
    checkpoint.save({"w": torch.full((1000,), 3.0)}, 3, directory=d, blocking=False)
    with pytest.raises(CollectionError) as err:
        checkpoint.wait()
    assert "checkpoint of step 3 was not written" in str(err.value)
    assert "No space left on device" in str(err.value) and "LATEST still names" in str(err.value)
    assert most[0] == 1  # one write at a time
    assert checkpoint.latest_step(d) == 2 and torch.equal(checkpoint.load(d)["w"], torch.full((1000,), 2.0))
    checkpoint.save({"w": torch.full((1000,), 4.0)}, 4, directory=d, blocking=False)
    checkpoint.finish()  # the end of a run: nothing raised, the write done
    assert checkpoint.latest_step(d) == 4


KILLED_MIDWAY = """
import os, signal, sys, torch
from sparkml_dist.runner import checkpoint
d = sys.argv[1]
checkpoint.save({"w": torch.zeros(1000)}, 1, directory=d)
real_put = checkpoint._put
def half_then_killed(folder, name, data):
    with open(folder.path(name) + ".tmp-killed", "wb") as fh:
        fh.write(bytes(data[: len(data) // 2]))
        fh.flush()
    os.kill(os.getpid(), signal.SIGKILL)
checkpoint._put = half_then_killed
checkpoint.save({"w": torch.ones(1000)}, 2, directory=d, blocking=False)
checkpoint.wait()
"""


def test_a_background_write_killed_midway_leaves_the_previous_checkpoint_the_latest(tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "RANK": "0"}
    proc = subprocess.run([sys.executable, "-c", KILLED_MIDWAY, str(tmp_path)], env=env, timeout=120)
    assert proc.returncode == -9  # killed for real, mid-write
    assert (tmp_path / "step-000000000002.pt.tmp-killed").exists()
    state = checkpoint.load(str(tmp_path))
    assert checkpoint.latest_step(str(tmp_path)) == 1 and torch.equal(state["w"], torch.zeros(1000))


def test_background_checkpoints_resume_exactly_and_the_run_waits_for_the_last_write(tmp_path):
    clean = BarrierRunner(-2, timeout=120, checkpoint_dir=str(tmp_path / "clean")).run(
        h.train_with_checkpoints
    )
    d = str(tmp_path / "bg")
    runner = BarrierRunner(-2, timeout=180, checkpoint_dir=d, max_restarts=1)
    resumed = runner.run(
        h.train_with_checkpoints, crash_at=7, crash_once_marker=str(tmp_path / "crashed"), blocking=False
    )
    assert resumed["resumed_from"] > 0  # the restart started from a background checkpoint
    assert torch.equal(resumed["weight"], clean["weight"]) and torch.equal(resumed["bias"], clean["bias"])
    assert checkpoint.latest_step(d) == 11  # the save of the last step, in flight at the end, was waited for


def test_save_refuses_a_bad_keep_or_step_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigurationError, match="keep"):
        checkpoint.save({"w": torch.ones(1)}, 1, directory=str(tmp_path), keep=-1, blocking=False)
    with pytest.raises(ConfigurationError, match="step"):
        checkpoint.save({"w": torch.ones(1)}, -1, directory=str(tmp_path), blocking=False)


# ------------------------------------------------------------------ the directory's rules (issue 52)
def _planted(tmp_path, mode=0o755, uid=None):
    """Another user's folder holding their step 999 (made by root here: chown to a stranger)."""
    folder = tmp_path / "planted"
    folder.mkdir()
    (folder / "step-000000000999.pt").write_bytes(b"theirs")
    record = {"step": 999, "file": "step-000000000999.pt", "bytes": 6, "sha256": "0" * 64}
    (folder / "LATEST").write_text(json.dumps(record))
    os.chmod(folder, mode)
    if uid is not None:
        os.chown(folder, uid, uid)
    return folder


@pytest.mark.parametrize(
    "how,says",
    [
        ({"uid": 12345}, "belongs to another user (uid 12345)"),
        ({"mode": 0o777}, "is writable by other users (mode drwxrwxrwx)"),
    ],
)
def test_a_planted_checkpoint_dir_is_refused_and_nothing_is_read_or_written(tmp_path, monkeypatch, how, says):
    monkeypatch.setenv("RANK", "0")
    folder = _planted(tmp_path, **how)
    before = sorted(os.listdir(folder))
    for call in (
        lambda: checkpoint.load(str(folder)),
        lambda: checkpoint.latest_step(str(folder)),
        lambda: checkpoint.save({"w": torch.ones(2)}, 1, directory=str(folder)),
        lambda: checkpoint.save({"w": torch.ones(2)}, 1, directory=str(folder), blocking=False),
    ):
        with pytest.raises(ConfigurationError) as err:
            call()
        assert f"checkpoint_dir={str(folder)!r} {says}" in str(err.value) and "chmod go-w" in str(err.value)
    assert sorted(os.listdir(folder)) == before  # nothing written, nothing removed


def test_a_checkpoint_dir_swapped_for_a_link_between_attempts_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    mine = tmp_path / "ckpt"
    checkpoint.save({"w": torch.ones(2)}, 3, directory=str(mine))  # attempt 1 saved step 3
    theirs = _planted(tmp_path)
    os.rename(mine, tmp_path / "moved")
    os.symlink(theirs, mine)  # swapped before the restart resumes
    with pytest.raises(ConfigurationError, match="without following a link"):
        checkpoint.load(str(mine))
    with pytest.raises(ConfigurationError, match="without following a link"):
        checkpoint.save({"w": torch.ones(2)}, 4, directory=str(mine))
    assert sorted(os.listdir(theirs)) == ["LATEST", "step-000000000999.pt"]


def test_checkpoint_files_are_private_to_their_user(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    d = tmp_path / "new" / "ckpt"
    checkpoint.save({"w": torch.ones(2)}, 1, directory=str(d))
    assert os.stat(d).st_mode & 0o777 == 0o700
    assert {f: os.stat(d / f).st_mode & 0o777 for f in os.listdir(d)} == {
        "LATEST": 0o600,
        "step-000000000001.pt": 0o600,
    }


def test_a_failed_background_write_on_a_full_disk_leaves_no_temporary_file(tmp_path, monkeypatch):
    """A 1 MiB tmpfs as checkpoint_dir: a 3 MB state fails with ENOSPC, its half-written temporary
    file is removed, so the next small save fits; LATEST stays the previous step throughout."""
    import subprocess

    monkeypatch.setenv("RANK", "0")
    disk = tmp_path / "small"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(disk)], check=True)
    try:
        d = str(disk)
        checkpoint.save({"w": torch.ones(100)}, 1, directory=d)
        checkpoint.save({"w": torch.ones(750_000)}, 2, directory=d, blocking=False)
        with pytest.raises(CollectionError, match="No space left on device"):
            checkpoint.wait()
        assert sorted(os.listdir(disk)) == ["LATEST", "step-000000000001.pt"]  # no temporary left
        assert checkpoint.latest_step(d) == 1
        checkpoint.save({"w": torch.full((1000,), 3.0)}, 3, directory=d, blocking=False)
        assert checkpoint.wait() == 3 and torch.equal(checkpoint.load(d)["w"], torch.full((1000,), 3.0))
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_step_saved_again_never_leaves_the_directory_without_a_loadable_latest(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    d = str(tmp_path)
    checkpoint.save({"w": torch.ones(3)}, 5, directory=d)
    real_put = checkpoint._put

    def latest_fails(folder, name, data):
        if name == "LATEST":
            raise OSError(28, "No space left on device")
        real_put(folder, name, data)

    monkeypatch.setattr(checkpoint, "_put", latest_fails)
    with pytest.raises(OSError):
        checkpoint.save({"w": torch.zeros(3)}, 5, directory=d)  # the same step, then LATEST fails
    monkeypatch.setattr(checkpoint, "_put", real_put)
    assert torch.equal(checkpoint.load(d)["w"], torch.ones(3))  # the first save of step 5, whole
    checkpoint.save({"w": torch.full((3,), 2.0)}, 5, directory=d)  # saved again: a new name, committed
    assert torch.equal(checkpoint.load(d)["w"], torch.full((3,), 2.0))
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
