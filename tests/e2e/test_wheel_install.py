"""A newcomer's install: a wheel built from this checkout, ``pip install <wheel>[torch]`` into a
fresh virtual environment (nothing else: no ``make``, no activation, no PYSPARK_PYTHON), then the
quickstart of the README and of the install page, and a first example of each other feature the
torch extra serves (per group, search, predict_batch), run by that venv's plain ``python`` from a
directory outside the checkout (so the installed package is the one imported); then the cluster
hour: a plain SparkSession (the executors start this venv's Python), an executor Python without
the package (refused in a few lines), and this venv shipped to the two executor JVMs of a
local-cluster whose own Python (``PYSPARK_PYTHON``: the base interpreter) lacks torch.

Slow (minutes): it builds and installs a wheel with torch into a fresh venv and packs that venv
(about 2 GB) for the local-cluster: what a newcomer's first hour on a cluster does."""

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
# each other feature's first example, on the quickstart's session (``spark``)
FEATURES = """
from sklearn.linear_model import LogisticRegression
from sklearn.tree import DecisionTreeClassifier
from sparkml_dist.ensemble import train_per_group
from sparkml_dist.inference import predict_batch
from sparkml_dist.search import ParallelSearchCV

Xs, ys = make_classification(n_samples=600, n_features=4, random_state=0)
names = ["a", "b", "c", "d"]
small = spark.createDataFrame(
    pd.DataFrame(Xs, columns=names).assign(label=ys.astype(float), store=[f"s{i % 3}" for i in range(600)])
)


def fit(data, key):
    m = LogisticRegression().fit(data[names], data["label"])
    return m, {"acc": m.score(data[names], data["label"])}


print("groups", len(train_per_group(small, fit, group_col="store").members))
search = ParallelSearchCV(DecisionTreeClassifier(random_state=0), {"max_depth": [2, 4]}, cv=3).fit(Xs, ys)
print("best", search.best_params_["max_depth"])
scored = predict_batch(small, model=LogisticRegression().fit(Xs, ys), input_cols=names)
print("scored", scored.count())
"""


# a program as most users write it: a plain SparkSession (not get_session), the venv not activated
PLAIN = """
import sys
from pyspark.sql import SparkSession
from sparkml_dist.runner import BarrierRunner


def world():
    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    init_process_group()
    return dist.get_world_size()


spark = SparkSession.builder.master("local[2]").getOrCreate()
try:
    print("WORLD", BarrierRunner(2, log_ranks="none").run(world))
except Exception as exc:
    print(exc, file=sys.stderr)
    sys.exit(3)
"""


# the driver's environment shipped to a cluster's executors (local-cluster: two executor JVMs), whose
# ranks then run its interpreter: prints the world size and whether every rank ran the shipped one
SHIPPED = """
from sparkml_dist.runner import BarrierRunner
from sparkml_dist.session import get_session


def world():
    import sys

    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    init_process_group()
    return [dist.get_world_size(), sys.executable]


spark = get_session("local-cluster[2,1,1024]", ship_environment=True)
out = BarrierRunner(2, log_ranks="none").run(world, return_all=True)
print("SHIPPED", out[0][0], all(o[1].endswith("environment/bin/python") for o in out))
print("ARCHIVE", spark.conf.get("spark.archives").split("#")[0])
spark.stop()
"""


def _run(cmd, cwd, env, timeout=900):
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{cmd[:4]} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~6 min alone; beside the local pass's three workers it passed 10 min
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
    _run([python, "-m", "pip", "install", "-q", f"{dist / wheel}[torch,ship]"], str(tmp_path), env)

    pages = [open(os.path.join(ROOT, p)).read() for p in ("README.md", os.path.join("docs", "install.md"))]
    script = tmp_path / "quickstart.py"
    script.write_text("\n\n".join(BLOCK.findall(pages[0])[:1] + BLOCK.findall(pages[1]) + [FEATURES]))
    out = _run([python, str(script)], str(tmp_path), env, timeout=600)
    plain = tmp_path / "plain.py"
    plain.write_text(PLAIN)
    assert "WORLD 2" in _run([python, str(plain)], str(tmp_path), env, timeout=600)  # executors: this venv's
    base = dict(env, PYSPARK_PYTHON=sys.base_prefix + "/bin/python3")  # without the package or pyarrow
    bare = subprocess.run(
        [python, str(plain)], cwd=str(tmp_path), env=base, capture_output=True, text=True, timeout=600
    )
    told = (
        bare.stderr[bare.stderr.index("the executors' Python") :]
        if "the executors' Python" in bare.stderr
        else ""
    )
    assert bare.returncode == 3 and told and len(told.strip().splitlines()) <= 10, bare.stderr[-3000:]
    assert f"{sys.base_prefix}/bin/python3" in told and "sparkml_dist" in told and "PYSPARK_PYTHON" in told
    shipped = tmp_path / "shipped.py"
    shipped.write_text(SHIPPED)
    said = _run([python, str(shipped)], str(tmp_path), base, timeout=900)
    archive = said.split("ARCHIVE ")[-1].strip() if "ARCHIVE " in said else ""
    if archive.endswith(".tar.gz") and os.path.isfile(archive):
        os.unlink(archive)  # ~480 MB, named after this run's venv: never used again
    assert "SHIPPED 2 True" in said, said[-2000:]
    where = _run([python, "-c", "import sparkml_dist; print(sparkml_dist.__file__)"], str(tmp_path), env)
    assert where.startswith(str(venv)), where  # the installed package, not the checkout
    lines = out.strip().splitlines()
    accuracies = [float(x) for x in lines if re.fullmatch(r"0\.\d+|1\.0", x)]
    assert len(accuracies) == 2 and min(accuracies) > 0.8, out  # both bagging quickstarts trained
    assert "2000" in lines, out  # the two-rank job saw every row once
    assert lines[-3] == "groups 3" and lines[-2] in ("best 2", "best 4") and lines[-1] == "scored 600", out
    assert _run([str(venv / "bin" / "sparkml-dist"), "--version"], str(tmp_path), env).strip(), (
        "console script"
    )
