#!/bin/bash
# Everything that needs a GPU, in one command on a machine with an NVIDIA GPU and cupy:
#   bash benchmarks/gpu_check.sh [tests|explain|bench|suite|all]
# the cuda-marked tests, whether compiled CUDA calls really run compiled (benchmarks/cuda_explain.py),
# the GPU benchmarks (quick unless BQUICK is set to other flags) and the whole suite with CUDA usable.
# Logs go to $OUT (default ./gpu-logs). Each stage has a time limit (T1..T4, seconds).
# Where numba-cuda cannot import with the installed numpy (numba-cuda 0.2x uses numpy.row_stack,
# which numpy 2.5 removed), put a numpy 2.4 wheel in .whl/: the CUDA stages then run on it.
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-gpu-cache}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # GPU machines often run as root
nvidia-smi -L
CUDA_PATH_PY=$PWD
if ls .whl/numpy-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/kiln-np .whl/numpy-*.whl
  CUDA_PATH_PY=/tmp/kiln-np:$PWD
fi
PYTHONPATH=$CUDA_PATH_PY python3 -c "
import numpy, cupy, numba, kiln
print('numpy', numpy.__version__, 'cupy', cupy.__version__, 'numba', numba.__version__)
print('kiln.cuda.is_available():', kiln.cuda.is_available())" 2>&1 | tee "$OUT/versions.txt"
STAGE=${1:-all}
if [[ $STAGE == all || $STAGE == tests ]]; then
  PYTHONPATH=$CUDA_PATH_PY timeout "${T1:-300}" python3 -m pytest -p no:cacheprovider -m cuda tests/cuda tests/codegen/cuda \
    -q -rfEs --tb=short 2>&1 | tee "$OUT/cuda_tests.log" | tail -60
fi
if [[ $STAGE == all || $STAGE == explain ]]; then
  PYTHONPATH=$CUDA_PATH_PY timeout "${T2:-120}" python3 -m benchmarks.cuda_explain 2>&1 | tee "$OUT/explain.log" | tail -40
fi
if [[ $STAGE == all || $STAGE == bench ]]; then
  # shellcheck disable=SC2086  # BQUICK holds several flags
  PYTHONPATH=$CUDA_PATH_PY timeout "${T3:-600}" python3 -m benchmarks.run --device cuda ${BQUICK---quick} \
    --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -40
fi
if [[ $STAGE == all || $STAGE == suite ]]; then
  timeout "${T4:-900}" python3 -m pytest -p no:cacheprovider -q -rfE --tb=line --ignore=tests/cuda \
    --ignore=tests/codegen/cuda 2>&1 | tee "$OUT/suite.log" | tail -40
fi
