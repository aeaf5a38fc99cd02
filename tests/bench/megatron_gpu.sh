#!/usr/bin/env bash
# On one lent GPU (issue 22), logs under $OUT:
#     bash tests/bench/megatron_gpu.sh [megatron|tune|calibration|all]     # all: ~10 minutes on an H100
# megatron: bench_megatron.py, three one-GPU layouts of a 1.1B Llama each run by real Megatron-LM (NVIDIA's
#   pretrain_gpt.py through --probe megatron's code), by the torch-native probe and predicted by plan (~5 min);
# tune: the user's path, tune --framework megatron-lm --probe megatron, two probes (~2.5 min);
# calibration: bench_calibration.py, tune calibrate on this GPU, then probes at MBS 1, 2, 4 against the catalog's
#   and the calibrated plan (issue 22's done-criterion on a GPU, ~2.5 min).
# A device command runs at most 10 minutes: run `megatron` in one call and `tune calibration` in the next.
# Needs build/megatron-lm-v0.17.1 (run's carry=["build/megatron-lm-v0.17.1"], 8.4 MB), made on the CPU machine by
#     git -C <NVIDIA/Megatron-LM clone> archive core_v0.17.1 megatron pretrain_gpt.py gpt_builders.py \
#         model_provider.py LICENSE | tar -x -C build/megatron-lm-v0.17.1
# and checked there: python tests/bench/bench_megatron.py --check-args (Megatron-LM's own parse_args and
# validate_args accept every command).
set -u -o pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}   # keeps carried wheels (/tmp/site)
OUT=${OUT:-$PWD/gpu_out}
SRC=${MEGATRON_SRC:-$PWD/build/megatron-lm-v0.17.1}
PARTS=${*:-all}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
want() { [[ " $PARTS " == *" all "* || " $PARTS " == *" $1 "* ]]; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import sys, torch; print(sys.version.split()[0], torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
  PYTHONPATH=$SRC $PY -c "import megatron.core, megatron.training.arguments; print('megatron-core', megatron.core.__version__)"
} 2>&1 | tee -a "$OUT/megatron_env.log"
GPU=$($PY -c "import torch; from planner.hardware import catalog_id_for_device as c; print(c(torch.cuda.get_device_name(0)))")
$PY -c "import sys, yaml; sys.path.insert(0, 'tests/bench'); from bench_megatron import MODEL; \
print(yaml.safe_dump(MODEL.to_dict()))" > "$OUT/llama-1.1b.yaml"
if want megatron; then
  $PY tests/bench/bench_megatron.py --megatron-src "$SRC" --gpu "$GPU" --layouts "mbs=1;mbs=2;mbs=4,recompute=full" \
    2>&1 | tee "$OUT/bench_megatron.log"
fi
if want tune; then
  EXTRA=$($PY -c "import sys; sys.path.insert(0, 'tests/bench'); from bench_megatron import MEGATRON_EXTRA; \
print(' '.join(MEGATRON_EXTRA))")
  $PY -m search.cli --model "$OUT/llama-1.1b.yaml" --gpu "$GPU" --gpus 1 --gpus-per-node 1 --global-batch 16 \
    --seq-len 2048 --precision bf16 --framework megatron-lm --no-flash-attention --no-rampup --zero 0 \
    --probe megatron --command "python -u $SRC/pretrain_gpt.py {args} $EXTRA" --probe-steps 5 --probe-warmup 3 \
    --max-probes 2 --confirm-top 0 --study megatron --workdir "$OUT/tune-megatron" --no-progress 2>&1 \
    | tee "$OUT/tune_megatron.log"
fi
if want calibration; then
  $PY tests/bench/bench_calibration.py --device cuda --gpu "$GPU" --precision bf16 --model "$OUT/llama-1.1b.yaml" \
    --mbs 1,2,4 --gas 4 --steps 5 2>&1 | tee "$OUT/bench_calibration.log"
fi
