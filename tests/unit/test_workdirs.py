"""Working directories as torchrun's: the launch directory here, one kept directory per machine and
job elsewhere; archives unpacked there once per machine."""

import io
import os
import tarfile
import threading

import pytest

from sparkml_dist import ConfigurationError
from sparkml_dist.formats.files import extract_tar
from sparkml_dist.runner.tasks import workdirs


def test_ranks_here_run_in_the_launch_directory_and_elsewhere_in_a_kept_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(workdirs.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    launch = tmp_path / "project"
    launch.mkdir()
    assert workdirs.rank_cwd(None, str(launch), True, "train.py") == str(launch)
    elsewhere = workdirs.rank_cwd(None, str(launch), False, "/home/me/project/train.py")
    assert elsewhere == str(tmp_path / "tmp" / f"sparkml_dist-work-{os.getuid()}" / "train")
    assert os.stat(elsewhere).st_mode & 0o777 == 0o700
    (tmp_path / "tmp" / f"sparkml_dist-work-{os.getuid()}" / "train" / "ckpt").write_text("step 3")
    again = workdirs.rank_cwd(None, str(launch), False, "train.py")  # a second run finds it
    assert open(os.path.join(again, "ckpt")).read() == "step 3"
    chosen = workdirs.rank_cwd(str(tmp_path / "mine"), str(launch), True, "train.py")
    assert chosen == str(tmp_path / "mine") and os.path.isdir(chosen)


def test_a_planted_link_in_place_of_the_kept_directory_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(workdirs.tempfile, "gettempdir", lambda: str(tmp_path))
    root = tmp_path / f"sparkml_dist-work-{os.getuid()}"
    root.mkdir(mode=0o700)
    (tmp_path / "victim").mkdir()
    os.symlink(tmp_path / "victim", root / "train")
    with pytest.raises(ConfigurationError, match="not a directory of this user"):
        workdirs.rank_cwd(None, None, False, "train.py")


def _tgz(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_an_archive_is_unpacked_once_per_machine_and_never_over_a_folder_it_did_not_make(tmp_path):
    data = _tgz({"words.txt": b"a\nb\n"})
    calls = []

    def extract(blob, dest, what):
        calls.append(dest)
        extract_tar(blob, dest, what)

    threads = [
        threading.Thread(target=workdirs.place_archive, args=(str(tmp_path), "vocab", data, "v.tgz", extract))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and (tmp_path / "vocab" / "words.txt").read_bytes() == b"a\nb\n"
    (tmp_path / "mine").mkdir()
    with pytest.raises(ConfigurationError, match=r"already has 'mine'.*v.tgz#another_name"):
        workdirs.place_archive(str(tmp_path), "mine", data, "v.tgz", extract)
    other = _tgz({"words.txt": b"changed\n"})
    with pytest.raises(ConfigurationError, match="already has 'vocab'"):
        workdirs.place_archive(str(tmp_path), "vocab", other, "v.tgz", extract)


def test_a_directory_other_users_can_write_is_never_where_ranks_write(tmp_path, monkeypatch):
    monkeypatch.setattr(workdirs.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # as /tmp is
    with pytest.raises(ConfigurationError, match=r"work_dir=.*writable by other users.*chmod go-w"):
        workdirs.rank_cwd(str(shared), None, True, "train.py")
    # a shared launch directory is passed over for this user's own kept directory
    here = workdirs.rank_cwd(None, str(shared), True, "train.py")
    assert here == str(tmp_path / "tmp" / f"sparkml_dist-work-{os.getuid()}" / "train")
    # a link planted where the archive's lock or marker goes is refused, nothing written through it
    victim = tmp_path / "victim"
    victim.write_text("keep")
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    os.symlink(victim, mine / ".vocab.sparkml_dist-lock")
    with pytest.raises(ConfigurationError, match="is it a link"):
        workdirs.place_archive(str(mine), "vocab", _tgz({"a": b"1"}), "v.tgz", extract_tar)
    assert victim.read_text() == "keep"
