#!/usr/bin/env bash
# Installs Horovod 0.28.1 with PyTorch + Gloo (no MPI, TensorFlow or MXNet) into one Python environment,
# with NCCL GPU operations when a CUDA toolkit (nvcc) and a CUDA build of torch are present.
#
#   scripts/install_horovod.sh [PYTHON]        (make horovod runs it with the project's .venv)
#
# Horovod ships 0.28.1 as a source distribution only, and as published it does not compile against
# current PyTorch: CMakeLists.txt and horovod/torch/CMakeLists.txt set CMAKE_CXX_STANDARD 14, while
# torch's headers use C++17. This script builds it with both set to 17, checks the build, and keeps the
# wheel in a cache keyed by Python, torch and platform, so a second install on one machine takes seconds.
# The build takes ~15 minutes on 2 cores. Horovod is installed without its declared extras: its [spark]
# extra pins pyarrow<11, which would downgrade what pyspark and this package need; the runtime modules
# horovod.torch and horovod.spark.run need only the small dependencies installed below.
set -euo pipefail

PY="${1:-python3}"
# the build runs in another directory: resolve a relative interpreter path (.venv/bin/python) first
if [[ "$PY" == */* ]]; then PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"; fi
VERSION=0.28.1
# the sdist is pinned by its SHA-256: pip refuses any other file under that name (a mirror or a
# man in the middle cannot substitute one)
SDIST_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
CACHE_ROOT="${SPARKML_DIST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sparkml_dist}"

torch_version="$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)" || {
    echo "install_horovod: torch is not installed in $PY; install torch==2.13.0 first" >&2
    exit 1
}
tag="$("$PY" -c 'import sys, platform; print(f"cp{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}")')"

# GPU operations: NCCL when this machine can build them (nvcc, and torch built for CUDA), as the
# GPU collectives of HorovodRunner(use_gpu=True) need; Gloo-only otherwise. HOROVOD_GPU_OPERATIONS
# set by the caller wins.
torch_cuda="$("$PY" -c 'import torch; print(torch.version.cuda or "")')"
nvcc="$(command -v nvcc || { [[ -n "${CUDA_HOME:-}" && -x "$CUDA_HOME/bin/nvcc" ]] && echo "$CUDA_HOME/bin/nvcc"; } || true)"
gpu_ops="${HOROVOD_GPU_OPERATIONS:-}"
if [[ -z "$gpu_ops" && -n "$torch_cuda" && -n "$nvcc" ]]; then gpu_ops=NCCL; fi
if [[ "$gpu_ops" == NCCL ]]; then
    echo "install_horovod: GPU operations: NCCL (torch built for CUDA $torch_cuda, nvcc at $nvcc)"
    # NCCL from torch's own nvidia-nccl wheel when there is no system NCCL
    nccl_home="$("$PY" -c 'import os, nvidia.nccl as n; print(os.path.dirname(n.__file__) if n.__file__ else list(n.__path__)[0])' 2>/dev/null || true)"
    if [[ -z "${HOROVOD_NCCL_HOME:-}" && -n "$nccl_home" && -d "$nccl_home/include" ]]; then
        export HOROVOD_NCCL_INCLUDE="$nccl_home/include" HOROVOD_NCCL_LIB="$nccl_home/lib" HOROVOD_NCCL_LINK=SHARED
    fi
    export HOROVOD_GPU_OPERATIONS=NCCL
else
    why="a CPU build of torch"; [[ -n "$torch_cuda" ]] && why="no CUDA toolkit (nvcc)"
    echo "install_horovod: GPU operations: none, Gloo only ($why)"
    unset HOROVOD_GPU_OPERATIONS
fi
cache="$CACHE_ROOT/horovod-$VERSION/$tag-torch-$torch_version${gpu_ops:+-$gpu_ops}"
mkdir -p "$cache"

wheel="$(ls "$cache"/horovod-"$VERSION"-*.whl 2>/dev/null | head -n 1 || true)"
if [[ -z "$wheel" ]]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    echo "install_horovod: building Horovod $VERSION against torch $torch_version (~15 min on 2 cores)"
    "$PY" -m pip install -q "setuptools" "wheel"
    command -v cmake >/dev/null || "$PY" -m pip install -q "cmake>=3.13"
    echo "horovod==$VERSION --hash=sha256:$SDIST_SHA256" > "$work/requirements.txt"
    "$PY" -m pip download -q --no-deps --no-binary :all: --no-build-isolation --require-hashes \
        -r "$work/requirements.txt" -d "$work"
    tar -xzf "$work"/horovod-"$VERSION".tar.gz -C "$work"
    src="$work/horovod-$VERSION"
    # The C++17 fix: torch >= 2.1 headers need C++17; Horovod 0.28.1 asks CMake for C++14.
    for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
        sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$f"
        grep -q 'set(CMAKE_CXX_STANDARD 17)' "$f" || {
            echo "install_horovod: $f has no CMAKE_CXX_STANDARD line to raise to 17; the sdist changed" >&2
            exit 1
        }
    done
    (
        cd "$src"
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_MPI=1 \
        MAKEFLAGS="-j$(nproc)" \
            "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" .
    )
    built="$(ls "$work"/dist/horovod-"$VERSION"-*.whl)"
    # publish atomically under a name of its own: a concurrent or interrupted build never leaves
    # half a wheel in the cache, and two builds never write the same partial file
    partial="$(mktemp "$cache/.partial-XXXXXXXX.whl")"
    cp "$built" "$partial"
    mv "$partial" "$cache/$(basename "$built")"
    wheel="$cache/$(basename "$built")"
else
    echo "install_horovod: using cached $wheel"
fi

# --no-deps: the wheel's [spark] extra would pin pyarrow<11. Then horovod's own runtime requirements,
# none of which touches pyarrow, pandas or torch.
"$PY" -m pip install -q --no-deps --force-reinstall "$wheel"
"$PY" -m pip install -q "cloudpickle" "psutil" "pyyaml" "packaging" "cffi>=1.4.0"

# The build must have PyTorch and Gloo, or the runner's horovod backend cannot work.
check="$("$PY" -m horovod.runner.launch --check-build 2>&1)"
echo "$check"
wants=("\[X\] PyTorch" "\[X\] Gloo")
[[ "$gpu_ops" == NCCL ]] && wants+=("\[X\] NCCL")
for want in "${wants[@]}"; do
    grep -q "$want" <<<"$check" || {
        echo "install_horovod: the installed Horovod lacks ${want//\\/}" >&2
        exit 1
    }
done
"$PY" -c 'import horovod.torch as hvd, pyarrow, pandas; print("horovod", hvd.__version__ if hasattr(hvd, "__version__") else "ok", "pyarrow", pyarrow.__version__, "pandas", pandas.__version__)'
