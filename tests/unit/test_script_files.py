"""sparkml_dist.runner.script: a script's folder, --py-files and --archives reach the ranks."""

import io
import os
import sys
import tarfile
import zipfile

import pytest

from sparkml_dist import ConfigurationError
from sparkml_dist.runner.script import bundle, install


def _project(tmp_path):
    """PyTorch's DDP tutorial layout: multinode.py imports its sibling datautils.py."""
    root = tmp_path / "ddp-tutorial-series"
    (root / "helpers").mkdir(parents=True)
    (root / "multinode.py").write_text("from datautils import MyTrainDataset\nimport helpers\n")
    (root / "datautils.py").write_text("class MyTrainDataset:\n    size = 2048\n")
    (root / "helpers" / "__init__.py").write_text("NAME = 'helpers'\n")
    for skipped in (".git", "__pycache__", ".venv"):
        (root / skipped).mkdir()
        (root / skipped / "noise.py").write_text("raise SystemExit('shipped by mistake')\n")
    (root / "notes.txt").write_text("not Python: stays home\n")
    return root


def _names(data):
    return sorted(zipfile.ZipFile(io.BytesIO(data)).namelist())


def test_the_scripts_folder_is_shipped_and_imported_first(tmp_path, monkeypatch):
    root = _project(tmp_path)
    files = bundle(str(root / "multinode.py"))
    assert _names(files.folder) == ["datautils.py", "helpers/__init__.py", "multinode.py"]
    work = tmp_path / "rank-workdir"
    work.mkdir()
    monkeypatch.setattr(sys, "path", list(sys.path))
    for mod in ("datautils", "helpers"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    install(files, str(work))
    import datautils  # noqa: F401 - the shipped copy, not the original folder
    import helpers

    assert datautils.MyTrainDataset.size == 2048 and helpers.NAME == "helpers"
    assert datautils.__file__.startswith(str(work / "script-src"))


def test_py_files_and_archives_as_spark_submit_takes_them(tmp_path, monkeypatch):
    root = _project(tmp_path)
    lib = tmp_path / "libs.zip"
    with zipfile.ZipFile(lib, "w") as zf:
        zf.writestr("zipped_mod.py", "VALUE = 42\n")
    single = tmp_path / "single_mod.py"
    single.write_text("VALUE = 7\n")
    vocab = tmp_path / "vocab.tar.gz"
    with tarfile.open(vocab, "w:gz") as tf:
        info = tarfile.TarInfo("words.txt")
        info.size = 6
        tf.addfile(info, io.BytesIO(b"a\nb\nc\n"))
    files = bundle(str(root / "multinode.py"), [str(lib), str(single)], [f"{vocab}#vocab"])
    work = tmp_path / "w"
    work.mkdir()
    monkeypatch.setattr(sys, "path", list(sys.path))
    install(files, str(work))
    import single_mod
    import zipped_mod

    assert zipped_mod.VALUE == 42 and single_mod.VALUE == 7
    assert (work / "vocab" / "words.txt").read_text() == "a\nb\nc\n"


def test_bad_files_are_named(tmp_path):
    root = _project(tmp_path)
    script = str(root / "multinode.py")
    with pytest.raises(ConfigurationError, match=r"--py-files: no file at"):
        bundle(script, [str(tmp_path / "missing.zip")])
    (tmp_path / "data.csv").write_text("x\n")
    with pytest.raises(ConfigurationError, match=r"--py-files: .*data.csv' is not one of .py, .zip"):
        bundle(script, [str(tmp_path / "data.csv")])
    with pytest.raises(ConfigurationError, match=r"--archives: .* names the folder '\.\.'"):
        bundle(script, archives=[f"{tmp_path / 'x.zip'}#.."])


def test_an_archive_entry_pointing_outside_is_refused(tmp_path):
    evil = io.BytesIO()
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../../outside.py", "print('escaped')\n")
    from sparkml_dist.runner.script import ScriptFiles

    with pytest.raises(ConfigurationError, match=r"'\.\./\.\./outside.py' has an absolute or '\.\.' path"):
        install(ScriptFiles(folder=evil.getvalue()), str(tmp_path))
    assert not os.path.exists(tmp_path.parent / "outside.py")


def _tar(add):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        add(tar)
    return buf.getvalue()


def _entry(tar, name, kind=tarfile.REGTYPE, link="", data=b"x"):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def _cve_2025_4517(tar):
    """The published layout: directory names long enough that realpath() gives up resolving
    (PATH_MAX), symlinks through them, then a link up and out, and a file written through it."""
    comp, steps, path = "d" * 247, "abcdefghijklmnop", ""
    for step in steps:
        _entry(tar, os.path.join(path, comp), tarfile.DIRTYPE)
        _entry(tar, os.path.join(path, step), tarfile.SYMTYPE, comp)
        path = os.path.join(path, comp)
    link = os.path.join("/".join(steps), "l" * 254)
    _entry(tar, link, tarfile.SYMTYPE, "../" * len(steps))
    _entry(tar, "escape", tarfile.SYMTYPE, link + "/" + "../" * 8 + "tmp")
    _entry(tar, "escape/escaped-by-cve", data=b"escaped")


TAR_TRICKS = {
    "symlink out": lambda t: (_entry(t, "up", tarfile.SYMTYPE, "../.."), _entry(t, "up/escaped", data=b"x")),
    "absolute symlink": lambda t: _entry(t, "etc", tarfile.SYMTYPE, "/etc"),
    "hard link": lambda t: _entry(t, "pw", tarfile.LNKTYPE, "etc/passwd"),
    "character device": lambda t: _entry(t, "zero", tarfile.CHRTYPE),
    "fifo": lambda t: _entry(t, "pipe", tarfile.FIFOTYPE),
    "absolute path": lambda t: _entry(t, "/tmp/escaped-absolute"),
    "dot-dot path": lambda t: _entry(t, "ok/../../escaped-dotdot"),
    "CVE-2025-4517 layout": _cve_2025_4517,
}


@pytest.mark.parametrize("trick", sorted(TAR_TRICKS))
def test_hostile_tar_archives_are_refused_whole_and_write_nothing(tmp_path, trick):
    from sparkml_dist.runner.script import ScriptFiles

    box = tmp_path / "box"
    work = box / "rank"
    work.mkdir(parents=True)
    folder = io.BytesIO()
    zipfile.ZipFile(folder, "w").close()
    files = ScriptFiles(folder=folder.getvalue(), archives=(("data.tar", "data", _tar(TAR_TRICKS[trick])),))
    before = set(os.listdir("/tmp"))
    with pytest.raises(ConfigurationError, match=r"--archives data.tar: member .* (is a|has an absolute)"):
        install(files, str(work))
    assert not (work / "data").exists()  # refused before anything was extracted
    assert not [n for n in os.listdir(work) if n.endswith(".unpacking")]
    assert sorted(p.name for p in box.iterdir()) == ["rank"]
    assert not {n for n in set(os.listdir("/tmp")) - before if n.startswith("escaped")}


def test_zip_entries_that_are_links_are_refused(tmp_path):
    import stat

    from sparkml_dist.runner.script import ScriptFiles

    evil = io.BytesIO()
    with zipfile.ZipFile(evil, "w") as zf:
        info = zipfile.ZipInfo("link")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "/etc/passwd")
    files = ScriptFiles(folder=evil.getvalue())
    with pytest.raises(ConfigurationError, match="'link' is a link or special file"):
        install(files, str(tmp_path))
