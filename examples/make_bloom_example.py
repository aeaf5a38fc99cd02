"""Regenerate examples/bloom-176b-48x8-a100/: BLOOM-176B as BigScience trained it, emitted by plantune.

    python -m examples.make_bloom_example        # from the repository root

BLOOM's real layout (bigscience tr11-176B-ml.slurm): 48 nodes x 8 A100-80GB, TP=4 PP=12 DP=8,
MBS=2, GBS=2048 (2048 / (2·8) = 128 micro-batches), rampup 192 16 9765625, bf16 with the fork's
BF16 optimizer (ZeRO-1-like sharding, planned as zero=1, written as stage 0 in the JSON), full recompute
(--checkpoint-activations), no FlashAttention. The prediction is the planner's estimate for that layout.
"""

from __future__ import annotations

from pathlib import Path

from planner.emit import Prediction, RunSetup, emit
from planner.hardware import make_cluster
from planner.model import get_preset
from planner.rank import estimate
from planner.space import Candidate, TrainingSpec

OUT = Path(__file__).resolve().parent / "bloom-176b-48x8-a100"


def bloom_setup() -> RunSetup:
    model = get_preset("176B")
    training = TrainingSpec(global_batch=2048, seq_len=2048, precision="bf16", framework="megatron-deepspeed",
                            rampup=model.rampup, flash_attention=False, train_tokens=model.train_tokens)
    candidate = Candidate(tp=4, pp=12, dp=8, mbs=2, gas=2048 // (2 * 8), recompute="full", zero=1)
    cluster = make_cluster(gpu="A100-80GB", gpus=384)
    est = estimate(model, cluster, training, candidate)
    t = est.throughput
    prediction = Prediction(memory_gb_per_gpu=round(est.memory.total_gb, 3), step_time_s=round(est.step_time_s, 3),
                            model_tflops_per_gpu=round(t.model_tflops_per_gpu, 3),
                            hardware_tflops_per_gpu=round(t.hardware_tflops_per_gpu, 3), mfu=round(t.mfu, 4))
    return RunSetup(model=model, cluster=cluster, training=training, candidate=candidate, prediction=prediction)


def main(out: Path = OUT) -> list[Path]:
    """Write (or rewrite: this script owns the folder) the example."""
    return emit(bloom_setup(), "megatron-deepspeed", out, flavor="bigscience", force=True)


if __name__ == "__main__":
    for path in main():
        print(path)
