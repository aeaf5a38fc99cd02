#!/usr/bin/env bash
# Everything plantune checks on a lent GPU, in one call (one machine start), logs under $OUT:
#     bash tests/bench/gpu_session.sh            # on a CUDA machine; OUT defaults to ./gpu_out
# 1. the machine (nvidia-smi, torch, CUDA, NCCL versions); 2. tests/test_probes_cuda.py (the probes'
# CUDA path, NCCL kernel names); 3. tests/bench/bench_gpu.py (1.1B probe vs bf16 matmuls, memory vs
# the planner, the largest model that trains on the GPU).
set -u -o pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  $PY -c "import sys, torch; print(sys.version.split()[0], torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), torch.cuda.get_device_name(0))"
} 2>&1 | tee "$OUT/env.log"
$PY -m pytest -q -s -p no:cacheprovider tests/test_probes_cuda.py 2>&1 | tee "$OUT/pytest_cuda.log"
$PY tests/bench/bench_gpu.py "$@" 2>&1 | tee "$OUT/bench_gpu.log"
