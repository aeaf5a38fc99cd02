"""The planner on published Blackwell runs (tests/data/published_2025_dev.yaml, read by tests/blackwell_runs.py):
predicted / measured tokens/s per GPU for NeMo's DGX-GB200 rows on the gb200-nvl72 preset and with the trays alone
as NVLink domains (--nvlink-domain 4), and the FP8 recipe pairs of torchao's B200 and torchtitan's Blackwell rows.

    PYTHONPATH=$PWD python3 tests/bench/validate_blackwell.py
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from planner.hardware import preset_cluster  # noqa: E402
from planner.rank import estimate  # noqa: E402
from tests import blackwell_runs as B  # noqa: E402

NEMO = ["nemo_2504_gb200_gpt3_175b_tp4pp4vp12_128g", "nemo_2504_gb200_nemotron4_15b_dp64_64g",
        "nemo_2504_gb200_nemotron4_340b_tp8pp4vp12_128g", "nemo_2504_gb200_mixtral_8x7b_ep8_64g",
        "nemo_2507_gb200_llama4_scout_ep16_64g"]
PAIRS = [("torchao_b200_llama3_8b_mxfp8_cublas_fsdp8", "torchao_b200_llama3_8b_float8_tensorwise_fsdp8"),
         ("torchao_b200_llama3_8b_float8_rowwise_fsdp8", "torchao_b200_llama3_8b_float8_tensorwise_fsdp8"),
         ("torchao_b200_llama3_8b_float8_tensorwise_fsdp8", "torchao_b200_llama3_8b_bf16_fsdp8"),
         ("torchtitan_nvfp4doc_llama3_8b_mxfp8_fsdp4", "torchtitan_nvfp4doc_llama3_8b_bf16_fsdp4"),
         ("torchtitan_nvfp4doc_qwen3_8b_mxfp8_fsdp4", "torchtitan_nvfp4doc_qwen3_8b_bf16_fsdp4")]


def tps(run) -> float:
    e = estimate(run.model, run.cluster, run.training, run.cand)
    return run.training.global_batch * run.training.seq_len / e.step_time_s / run.cluster.world_size


def main() -> int:
    print("| NeMo DGX-GB200 row | layout | measured | pred/meas NVL72 | pred/meas trays only |")
    print("|---|---|---|---|---|")
    logs = []
    for rid in NEMO:
        run = B.nemo_gb200_run(rid)
        c = run.cand
        trays = replace(run, cluster=preset_cluster("gb200-nvl72", gpus=run.cluster.world_size, nvlink_domain=4))
        r, rt = tps(run) / run.tokens_per_s_per_gpu, tps(trays) / run.tokens_per_s_per_gpu
        logs.append(math.log(r))
        print(f"| {rid} | TP{c.tp} PP{c.pp} DP{c.dp} EP{c.ep} (domain {run.cluster.domain_gpus}) | "
              f"{run.tokens_per_s_per_gpu:,.0f} | {r:.2f} | {rt:.2f} |")
    print(f"\ngeometric mean pred/meas on NVL72: {math.exp(sum(logs) / len(logs)):.3f}; "
          f"mean abs error {sum(abs(math.exp(x) - 1) for x in logs) / len(logs):.1%}\n")
    print("| recipe pair (tokens/s ratio) | measured | predicted | abs pred/meas of the first |")
    print("|---|---|---|---|")
    for a, b in PAIRS:
        ra, rb = B.torchao_run(a), B.torchao_run(b)
        pa, pb = tps(ra), tps(rb)
        print(f"| {a} / {b} | {ra.tokens_per_s_per_gpu / rb.tokens_per_s_per_gpu:.3f} | {pa / pb:.3f} | "
              f"{pa / ra.tokens_per_s_per_gpu:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
