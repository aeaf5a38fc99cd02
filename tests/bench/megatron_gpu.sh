#!/usr/bin/env bash
# Real Megatron-LM on one lent GPU, beside the torch-native probe and plan (issue 22), logs under $OUT:
#     bash tests/bench/megatron_gpu.sh        # ~8 minutes on an H100; OUT defaults to ./gpu_out
# Needs build/megatron-lm-v0.17.1 (carried: `run` carry=["build/megatron-lm-v0.17.1"]), made on the CPU machine by
#     git -C <NVIDIA/Megatron-LM clone> archive core_v0.17.1 megatron pretrain_gpt.py gpt_builders.py \
#         model_provider.py LICENSE | tar -x -C build/megatron-lm-v0.17.1
# and checked there with: python tests/bench/bench_megatron.py --check-args (Megatron-LM's own parse_args and
# validate_args accept every command). 1. the machine and Megatron's imports; 2. bench_megatron.py: three layouts,
# each by Megatron-LM, by the torch probe and by plan; 3. the user's path: tune --framework megatron-lm --probe
# megatron on the same model, two probes.
set -u -o pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-$PWD/gpu_out}
SRC=${MEGATRON_SRC:-$PWD/build/megatron-lm-v0.17.1}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import sys, torch; print(sys.version.split()[0], torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
  PYTHONPATH=$SRC $PY -c "import megatron.core, megatron.training.arguments; print('megatron-core', megatron.core.__version__)"
} 2>&1 | tee "$OUT/megatron_env.log"
$PY tests/bench/bench_megatron.py --megatron-src "$SRC" --layouts "mbs=1;mbs=2;mbs=4,recompute=full" 2>&1 \
  | tee "$OUT/bench_megatron.log"
$PY -c "import sys, yaml; sys.path.insert(0, 'tests/bench'); from bench_megatron import MODEL; \
print(yaml.safe_dump(MODEL.to_dict()))" > "$OUT/llama-1.1b.yaml"
GPU=$($PY -c "import torch; from planner.hardware import catalog_id_for_device as c; print(c(torch.cuda.get_device_name(0)))")
EXTRA=$($PY -c "import sys; sys.path.insert(0, 'tests/bench'); from bench_megatron import MEGATRON_EXTRA; print(' '.join(MEGATRON_EXTRA))")
$PY -m search.cli --model "$OUT/llama-1.1b.yaml" --gpu "$GPU" --gpus 1 --gpus-per-node 1 --global-batch 16 \
  --seq-len 2048 --precision bf16 --framework megatron-lm --no-flash-attention --no-rampup --zero 0 \
  --probe megatron --command "python -u $SRC/pretrain_gpt.py {args} $EXTRA" --probe-steps 5 --probe-warmup 3 \
  --max-probes 2 --confirm-top 0 --study megatron --workdir "$OUT/tune-megatron" --no-progress 2>&1 \
  | tee "$OUT/tune_megatron.log"
