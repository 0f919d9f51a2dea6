"""A newcomer's install: a wheel built from this checkout, ``pip install <wheel>[torch]`` into a
fresh virtual environment (nothing else: no ``make``, no activation, no PYSPARK_PYTHON), then the
quickstart of the README and of the install page run by that venv's plain ``python``, from a
directory outside the checkout (so the installed package is the one imported)."""

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

BLOCK = re.compile(r"<!-- run by tests/spark/test_readme.py -->\n```python\n(.*?)\n```", re.S)
# nothing of this session's: no PYTHONPATH to the checkout (pip would take its egg-info for an
# installed sparkml_dist), no PYSPARK_PYTHON, no virtual environment on PATH
SESSION_ONLY = ("PYSPARK", "PYTHON", "SPARKML_DIST", "VIRTUAL")


def _run(cmd, cwd, env, timeout=900):
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{cmd[:4]} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


@pytest.mark.slow
def test_a_wheel_installed_into_a_fresh_venv_runs_the_quickstart_from_a_plain_python(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(SESSION_ONLY)}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    dist = tmp_path / "dist"
    build = ["-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), ROOT]
    _run([sys.executable, *build], ROOT, env)
    (wheel,) = [p for p in os.listdir(dist) if p.endswith(".whl")]
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], str(tmp_path), env)
    python = str(venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "-q", f"{dist / wheel}[torch]"], str(tmp_path), env)

    pages = [open(os.path.join(ROOT, p)).read() for p in ("README.md", os.path.join("docs", "install.md"))]
    script = tmp_path / "quickstart.py"
    script.write_text("\n\n".join(BLOCK.findall(pages[0])[:1] + BLOCK.findall(pages[1])) + "\n")
    out = _run([python, str(script)], str(tmp_path), env, timeout=600)
    where = _run([python, "-c", "import sparkml_dist; print(sparkml_dist.__file__)"], str(tmp_path), env)
    assert where.startswith(str(venv)), where  # the installed package, not the checkout
    lines = out.strip().splitlines()
    accuracies = [float(x) for x in lines if re.fullmatch(r"0\.\d+|1\.0", x)]
    assert len(accuracies) == 2 and min(accuracies) > 0.8, out  # both bagging quickstarts trained
    assert lines[-1] == "2000", out  # the two-rank job saw every row once
