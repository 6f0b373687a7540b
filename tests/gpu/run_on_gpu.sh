#!/usr/bin/env bash
# The GPU checks of issue 24, in one run on a GPU machine (stage limits add up to under
# 8 minutes):
#   bash tests/gpu/run_on_gpu.sh          # from the repository root; results in $OUT
# Expects the lent machine's own stack (no registry there): python3 with torch (CUDA),
# CuPy with NCCL, mpi4py on Open MPI; installs this checkout without dependencies.
# Every stage is time-limited, logged to $OUT/<stage>.log, and a failure does not stop
# the next; $OUT/summary.txt lists each stage's exit code and seconds, and
# $OUT/figures.json holds the benchmark's figures.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # Open MPI as root
export OMPI_MCA_rmaps_base_oversubscribe=1  # 4 ranks whatever the slot count
: > "$OUT/summary.txt"

stage() {  # stage NAME SECONDS COMMAND...
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    echo "== $name (limit ${limit}s): $*" | tee -a "$OUT/summary.txt"
    timeout --kill-after=15 "$limit" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    echo "   $name: exit $rc after $(( $(date +%s) - start ))s" | tee -a "$OUT/summary.txt"
    tail -n 5 "$OUT/$name.log" | sed 's/^/   | /' | tee -a "$OUT/summary.txt"
}

stage environment 30 bash -c "nvidia-smi; $PY - <<'EOF'
import importlib
for name in ('torch', 'cupy', 'mpi4py', 'numpy', 'ml_dtypes', 'cloudpickle', 'pytest'):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, '__version__', '?'))
    except Exception as exc:
        print(name, 'MISSING:', exc)
import torch; print('cuda', torch.version.cuda, torch.cuda.device_count(), 'device(s)')
from cupy.cuda import nccl; print('nccl', nccl.get_version())
EOF"
stage install 45 "$PY" -m pip install --no-deps --no-build-isolation -e .  # else PYTHONPATH
stage check_build 30 "$PY" -m horovodish.launcher --check-build

if "$PY" -c "import pytest" 2>/dev/null; then
    stage kernel 60 "$PY" -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fusion_kernel.py
    stage collectives 190 "$PY" -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_paths.py
else  # the same checks without pytest: the worker at each size
    for run in "1 nccl" "2 mpi" "4 mpi"; do
        set -- $run
        stage "collectives_np$1_$2" 60 env HOROVODISH_GPU_OPERATIONS="$2" \
            "$PY" -m horovodish.launcher -np "$1" "$PY" tests/gpu/workers/gpu_worker.py
    done
fi

stage bench 120 env HOROVODISH_GPU_OPERATIONS=nccl \
    "$PY" -m horovodish.launcher -np 1 "$PY" tests/gpu/bench_gpu.py "$OUT/figures.json"

cp "$OUT/summary.txt" "$OUT/gpu.log"
for log in "$OUT"/*.log; do
    [ "$log" = "$OUT/gpu.log" ] || { echo "##### $log"; cat "$log"; } >> "$OUT/gpu.log"
done
echo "done: $OUT/summary.txt, $OUT/figures.json"
