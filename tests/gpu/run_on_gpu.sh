#!/usr/bin/env bash
# The GPU checks, in one run on a machine with a GPU (stage limits add up to about
# 11 minutes; passing runs of the one-rank stages took 74 to 89 s on an H100):
#   bash tests/gpu/run_on_gpu.sh          # from the repository root; results in $RESULTS
# Expects the machine's own stack (no package registry needed): python3 with torch (CUDA),
# CuPy with NCCL, mpi4py on Open MPI, pytest (and pytest-xdist, to run the 1-, 2- and
# 4-rank jobs side by side); installs this checkout without dependencies. JAX arrays on
# the GPU (tests/gpu/test_jax_gpu.py) are checked where JAX with CUDA and optax are
# installed too, and skipped, saying so, where they are not.
# Every stage is time-limited and logged, and a failure does not stop the next. Written:
# $RESULTS/summary.txt (each stage's exit code, seconds and last lines), $RESULTS/gpu.log
# (the summary, then every stage's whole log), $RESULTS/figures.json and
# figures-2-ranks.json (the benchmark's figures at one and two ranks) and their records. SKIP_INSTALL=1 skips the install stage.
set -u
cd "$(dirname "$0")/../.."
RESULTS=${RESULTS:-${OUT:-$PWD/gpu-out}}
LOGS=$(mktemp -d)
mkdir -p "$RESULTS"
# The interpreter's own path: ranks started by mpirun may find another python3 on PATH.
PY=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # Open MPI as root
export OMPI_MCA_rmaps_base_oversubscribe=1  # 4 ranks whatever the slot count
export HOROVODISH_GPU_TEST_TIMEOUT=${HOROVODISH_GPU_TEST_TIMEOUT:-150}  # per job
: > "$RESULTS/summary.txt"

stage() {  # stage NAME SECONDS COMMAND...
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    echo "== $name (limit ${limit}s): $*" | tee -a "$RESULTS/summary.txt"
    timeout --kill-after=15 "$limit" "$@" > "$LOGS/$name.log" 2>&1
    rc=$?
    echo "   $name: exit $rc after $(( $(date +%s) - start ))s" | tee -a "$RESULTS/summary.txt"
    tail -n 8 "$LOGS/$name.log" | sed 's/^/   | /' | tee -a "$RESULTS/summary.txt"
}

stage environment 40 bash -c "nvidia-smi -L; command -v mpirun && mpirun --version | head -2
$PY - <<'EOF'
import importlib
for name in ('torch', 'cupy', 'mpi4py', 'numpy', 'ml_dtypes', 'cloudpickle', 'pytest',
             'xdist', 'jax', 'optax'):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, '__version__', '?'))
    except Exception as exc:
        print(name, 'MISSING:', exc)
import torch; print('cuda', torch.version.cuda, torch.cuda.device_count(), 'device(s)')
from cupy.cuda import nccl; print('nccl', nccl.get_version())
EOF"
# --use-pep517: else setuptools' develop command runs a nested pip that wants a registry.
[ "${SKIP_INSTALL:-0}" = 1 ] ||
    stage install 60 "$PY" -m pip install --no-deps --no-build-isolation --no-index \
        --use-pep517 -e .
if ! "$PY" -c "import horovodish.launcher" 2>/dev/null; then
    # Not installed: horovodish.launcher (setup.py maps it to launcher/) through a link
    # in this copy of the checkout, with the checkout on PYTHONPATH.
    ln -sfn ../launcher horovodish/launcher
    echo "   horovodish.launcher linked into this checkout" | tee -a "$RESULTS/summary.txt"
fi
stage check_build 40 "$PY" -m horovodish.launcher --check-build

if ! command -v mpirun > /dev/null && ! [ -x "$(dirname "$($PY -c 'import sys; print(sys.executable)')")/mpirun" ]; then
    # No launcher: the one-rank NCCL checks still run, as an MPI singleton.
    stage kernel 90 "$PY" -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fusion_kernel.py
    stage collectives_np1_nccl 150 env HOROVODISH_GPU_OPERATIONS=nccl \
        "$PY" tests/gpu/workers/gpu_worker.py
    # JAX arrays on the GPU (needs a JAX that sees it; tests/gpu/test_jax_gpu.py skips
    # without one, this stage then fails saying so).
    stage jax_np1_nccl 150 env HOROVODISH_GPU_OPERATIONS=nccl \
        XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" tests/gpu/workers/jax_gpu_worker.py
    stage bench 150 env HOROVODISH_GPU_OPERATIONS=nccl \
        "$PY" tests/gpu/bench_gpu.py "$RESULTS/figures.json"
else
    if "$PY" -c "import pytest, xdist" 2>/dev/null; then
        # The kernel tests and the rank jobs (NCCL, staged, faults) side by side.
        stage tests 240 "$PY" -m pytest -q -p no:cacheprovider -n 7 -rA tests/gpu
    else
        stage tests 300 "$PY" -m pytest -q -p no:cacheprovider -rA tests/gpu
    fi
    stage bench 150 env HOROVODISH_GPU_OPERATIONS=nccl \
        "$PY" -m horovodish.launcher -np 1 "$PY" tests/gpu/bench_gpu.py "$RESULTS/figures.json"
    # Against torch DDP on NCCL at two ranks on the one GPU (each its own NCCL host id).
    stage bench_2_ranks 150 env HOROVODISH_GPU_OPERATIONS=nccl \
        "$PY" -m horovodish.launcher -np 2 "$PY" tests/gpu/distinct_hosts.py \
        tests/gpu/bench_gpu.py "$RESULTS/figures-2-ranks.json" --against-ddp-only
fi

cp "$RESULTS/summary.txt" "$RESULTS/gpu.log"
for log in "$LOGS"/*.log; do
    { echo "##### $(basename "$log")"; cat "$log"; } >> "$RESULTS/gpu.log"
done
rm -rf "$LOGS"
echo "done: $RESULTS/summary.txt, $RESULTS/gpu.log, $RESULTS/figures.json"
