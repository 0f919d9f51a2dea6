"""scripts/install_horovod.sh on a machine where it already ran (make test runs it first)."""

import os
import subprocess
import sys

from tests.conftest import ROOT, masters


@masters("local")
def test_a_second_install_uses_the_cached_wheel_and_keeps_pyarrow_and_pandas():
    import pandas
    import pyarrow

    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "install_horovod.sh"), sys.executable],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "using cached" in proc.stdout and "building Horovod" not in proc.stdout
    assert "[X] PyTorch" in proc.stdout and "[X] Gloo" in proc.stdout  # the build check ran
    # it says which GPU operations it built: none on this CPU machine (NCCL needs nvcc + CUDA torch)
    assert "GPU operations: none, Gloo only (a CPU build of torch)" in proc.stdout
    # the versions the package needs are untouched (Horovod's [spark] extra would pin pyarrow<11)
    assert f"pyarrow {pyarrow.__version__} pandas {pandas.__version__}" in proc.stdout
