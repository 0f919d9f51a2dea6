"""Ensembles as a real driver meets them: members larger than spark.driver.maxResultSize."""

import json
import os
import subprocess
import sys

from tests.conftest import ROOT, masters


@masters("local")
def test_an_ensemble_too_big_to_collect_fits_with_members_dir(tmp_path):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run(
        [sys.executable, "tests/e2e/big_ensemble_job.py", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert "larger than spark.driver.maxResultSize" in out["collected"] and "membersDir=" in out["collected"]
    assert out["sizes"] == [10_000] * 4 and out["transform_rows"] > 20_000 and out["same"]
