"""sparkml_dist.runner.script_files: a script's folder, --py-files and --archives reach the ranks."""

import io
import os
import sys
import tarfile
import zipfile

import pytest

from sparkml_dist import ConfigurationError
from sparkml_dist.runner.script_files import bundle, install


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
    from sparkml_dist.runner.script_files import ScriptFiles

    with pytest.raises(ConfigurationError, match="points outside its folder"):
        install(ScriptFiles(folder=evil.getvalue()), str(tmp_path))
    assert not os.path.exists(tmp_path.parent / "outside.py")
