"""The environment shipped to the executors (``get_session(ship_environment=True)``): packed where
only this user can write, named after its full path, without the files that hold credentials or
pyspark's JVM side; an editable install refused by name."""

import logging
import os
import subprocess
import sys
import tarfile

import pytest

from sparkml_dist import ConfigurationError
from sparkml_dist import session as session_mod


def _venv(where):
    """A small virtual environment (no pip) at ``where``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    return str(where)


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    import tempfile

    base = tmp_path / "tmp"
    base.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    return base


def test_two_projects_dot_venv_pack_to_two_archives_in_a_private_directory(tmp_path, private_tmp, caplog):
    """Both environments are ``.venv``: each gets its own archive (before: one path, the second
    replacing the archive the first gave Spark); the credentials files stay out, named."""
    a = _venv(tmp_path / "project_a" / ".venv")
    b = _venv(tmp_path / "project_b" / ".venv")
    (tmp_path / "project_a" / ".venv" / "pip.conf").write_text("[global]\nindex-url = https://u:token@x/\n")
    site = next((tmp_path / "project_a" / ".venv" / "lib").glob("python*")) / "site-packages"
    (site / ".env").write_text("AWS_SECRET_ACCESS_KEY=x\n")
    for part in ("pyspark/jars", "pyspark/work/app-1/0", "pyspark/sql"):  # the JVM side, a cluster's scratch
        (site / part).mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    (site / "pyspark" / "sql" / "__init__.py").write_text("")
    (site / "pyspark" / "jars" / "spark-core.jar").write_bytes(b"PK")
    (site / "pyspark" / "work" / "app-1" / "0" / "environment.tar.gz").write_bytes(b"x")
    with caplog.at_level(logging.WARNING, logger="sparkml_dist.session"):
        archive_a = session_mod.pack_environment(prefix=a)
    archive_b = session_mod.pack_environment(prefix=b)
    assert archive_a != archive_b and os.path.dirname(archive_a) == os.path.dirname(archive_b)
    directory = os.path.dirname(archive_a)
    assert directory == str(private_tmp / f"sparkml_dist-env-{os.getuid()}")
    assert os.stat(directory).st_mode & 0o777 == 0o700
    with tarfile.open(archive_a) as tar:
        names = tar.getnames()
    assert "bin/python" in names or any(n.endswith("/python") for n in names)
    assert not any(os.path.basename(n) in ("pip.conf", ".env") for n in names), names
    shipped_pyspark = sorted(n.split("site-packages/", 1)[1] for n in names if "/pyspark/" in n)
    assert shipped_pyspark == ["pyspark/__init__.py", "pyspark/sql/__init__.py"], shipped_pyspark  # no jars
    said = caplog.text
    assert "pip.conf" in said and ".env" in said and "credentials" in said
    assert not [f for f in os.listdir(directory) if f.endswith(".tmp")]  # written, then moved


def test_an_archive_place_another_user_could_control_is_refused(tmp_path, private_tmp):
    env = _venv(tmp_path / "env")
    planted = private_tmp / f"sparkml_dist-env-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)
    with pytest.raises(ConfigurationError, match="writable by other users|open to other users"):
        session_mod.pack_environment(prefix=env)
    planted.rmdir()
    planted.symlink_to(tmp_path)
    with pytest.raises(ConfigurationError, match="link"):
        session_mod.pack_environment(prefix=env)
    planted.unlink()
    for target in (tmp_path / "a_dir", tmp_path / "a_link"):
        if target.name == "a_dir":
            target.mkdir()
        else:
            target.symlink_to(tmp_path / "elsewhere.tar.gz")
        with pytest.raises(ConfigurationError, match="not a regular file"):
            session_mod.pack_environment(output=str(target), prefix=env)
    assert not (tmp_path / "elsewhere.tar.gz").exists()


def test_an_editable_install_is_refused_by_name_with_the_fix(tmp_path, private_tmp):
    env = _venv(tmp_path / "env")
    site = next((tmp_path / "env" / "lib").glob("python*")) / "site-packages"
    (site / "__editable__.mypkg-0.1.pth").write_text(str(tmp_path / "src") + "\n")
    with pytest.raises(ConfigurationError, match=r"editable mode \(__editable__.mypkg-0.1\).*without -e"):
        session_mod.pack_environment(prefix=env)


def test_a_large_archive_is_said_to_be(tmp_path, private_tmp, monkeypatch, caplog):
    env = _venv(tmp_path / "env")
    monkeypatch.setattr(session_mod, "LARGE_BYTES", 1)
    with caplog.at_level(logging.WARNING, logger="sparkml_dist.session"):
        session_mod.pack_environment(prefix=env)
    assert "GiB; every executor copies and unpacks it" in caplog.text
