"""Setups the emitter tests share: valid ones per kind and flavor, and rule-breaking ones.

BLOOM-176B's real layout (tr11-176B-ml.slurm) is the anchor; GPT-3 175B is expressible in both
forks; Llama-2 (GQA, RMSNorm, SwiGLU, RoPE, untied, no biases) only in the microsoft fork,
Megatron-LM and FSDP.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.emit import Prediction, RunSetup
from planner.hardware import make_cluster
from planner.model import Rampup, get_preset
from planner.space import Candidate, TrainingSpec

PREDICTION = Prediction(memory_gb_per_gpu=61.25, step_time_s=104.7, model_tflops_per_gpu=149.77,
                        hardware_tflops_per_gpu=199.7, mfu=0.48)


def bloom(*, tp: int = 4, pp: int = 12, mbs: int = 2, zero: int = 0, recompute: str = "full",
          prediction: Prediction | None = None, **training: object) -> RunSetup:
    """BLOOM-176B on 48 x 8 A100-80GB; DP follows from TP and PP, GAS from the batch."""
    model = get_preset("176B")
    dp = 384 // (tp * pp)
    t = TrainingSpec(global_batch=2048, seq_len=2048, precision="bf16", rampup=model.rampup, flash_attention=False,
                     train_tokens=model.train_tokens)
    t = replace(t, **training) if training else t
    return RunSetup(model=model, cluster=make_cluster(gpu="A100-80GB", gpus=384), training=t,
                    candidate=Candidate(tp=tp, pp=pp, dp=dp, mbs=mbs, gas=t.global_batch // (mbs * dp),
                                        recompute=recompute, zero=zero),
                    prediction=prediction)


def gpt3(**candidate: object) -> RunSetup:
    """GPT-3 175B on 16 x 8 A100-80GB, TP=8 PP=8 DP=2, GBS 1536, rampup 16 16 5859375."""
    model = get_preset("gpt3-175b")
    t = TrainingSpec(global_batch=1536, seq_len=2048, precision="bf16", rampup=model.rampup, flash_attention=False,
                     train_tokens=300e9)
    c = replace(Candidate(tp=8, pp=8, dp=2, mbs=1, gas=768, recompute="full", zero=1), **candidate)
    return RunSetup(model=model, cluster=make_cluster(gpu="A100-80GB", gpus=128), training=t, candidate=c,
                    prediction=PREDICTION)


def llama(name: str = "llama2-70b", *, gpus: int = 256, gpu: str = "H100-SXM", **candidate: object) -> RunSetup:
    """A Llama-2 on H100s, GBS 1024 at seq 4096, no token budget (the launcher asks for TRAIN_SAMPLES)."""
    model = get_preset(name)
    t = TrainingSpec(global_batch=1024, seq_len=4096, precision="bf16", flash_attention=True)
    dp = max(gpus // 32, 1)
    c = replace(Candidate(tp=8, pp=4, dp=dp, mbs=1, gas=1024 // dp, recompute="selective", zero=1, sp=True),
                **candidate)
    return RunSetup(model=model, cluster=make_cluster(gpu=gpu, gpus=gpus), training=t, candidate=c,
                    prediction=PREDICTION)


@dataclass(frozen=True)
class Case:
    id: str
    setup: RunSetup
    kind: str
    flavor: str = "bigscience"

    def __post_init__(self) -> None:  # the training names the fork it is planned for (plan.yaml's plantune.flavor)
        if self.kind == "megatron-deepspeed":
            object.__setattr__(self, "setup", replace(self.setup, training=replace(self.setup.training,
                                                                                   flavor=self.flavor)))


VALID_CASES = [
    Case("bloom-bigscience", bloom(), "megatron-deepspeed"),
    Case("bloom-bigscience-predicted", bloom(prediction=PREDICTION), "megatron-deepspeed"),
    Case("gpt3-bigscience", gpt3(), "megatron-deepspeed"),
    Case("gpt3-bigscience-fp16", replace(gpt3(), training=replace(gpt3().training, precision="fp16")),
         "megatron-deepspeed"),
    Case("gpt3-microsoft", gpt3(), "megatron-deepspeed", "microsoft"),
    Case("gpt3-microsoft-norecompute", gpt3(recompute="none", zero=0), "megatron-deepspeed", "microsoft"),
    Case("llama70b-microsoft-sp-selective", llama(), "megatron-deepspeed", "microsoft"),
    Case("llama7b-microsoft-zero3-nopipe", llama("llama2-7b", gpus=16, tp=2, pp=1, dp=8, gas=128, zero=3,
                                                 recompute="full", sp=False),
         "megatron-deepspeed", "microsoft"),
    Case("llama70b-megatron-lm-vpp", llama(vpp=2), "megatron-lm"),
    Case("gpt3-megatron-lm", gpt3(), "megatron-lm"),
    # Megatron-FSDP (ZeRO-3 = optim_grads_params; ZeRO-2 = optim_grads), as Megatron-Bridge's Llama 3 8B recipe runs it
    Case("llama3-8b-megatron-fsdp", llama("llama3-8b", gpus=16, tp=1, pp=1, dp=16, gas=64, zero=3, recompute="none",
                                          sp=False), "megatron-lm"),
    Case("llama2-70b-megatron-fsdp-tp8", llama("llama2-70b", gpus=64, tp=8, pp=1, dp=8, gas=128, zero=2,
                                               recompute="full", sp=True), "megatron-lm"),
    Case("llama7b-fsdp-hybrid", llama("llama2-7b", gpus=32, tp=1, pp=1, dp=32, gas=32, zero=3, hybrid=True,
                                      recompute="full", sp=False), "fsdp"),
    Case("llama7b-fsdp-grad-op", llama("llama2-7b", gpus=32, tp=1, pp=1, dp=32, gas=32, zero=2, recompute="none",
                                       sp=False), "fsdp"),
    Case("llama7b-fsdp-noshard", llama("llama2-7b", gpus=16, tp=1, pp=1, dp=16, gas=64, zero=0, recompute="full",
                                       sp=False), "fsdp"),
]

GPT3_NO_RAMPUP = replace(gpt3(), training=replace(gpt3().training, rampup=None))

# (id, setup, kind, flavor, a piece of the one-line error)
REFUSED_CASES = [
    ("bloom-dp16-mbs2-rampup", bloom(pp=6), "megatron-deepspeed", "bigscience",
     "batch size 208 of the rampup is not divisible by MBS*DP = 2*16 = 32"),
    ("world-size", replace(bloom(), candidate=replace(bloom().candidate, dp=4, gas=256)), "megatron-deepspeed",
     "bigscience", "TP(4)*PP(12)*DP(4) = 192 != world size 384"),
    ("batch-identity", replace(bloom(), candidate=replace(bloom().candidate, gas=100)), "megatron-deepspeed",
     "bigscience", "MBS(2)*DP(8)*GAS(100) = 1600 != global batch 2048; use GAS = 128"),
    ("heads-tp", bloom(tp=3, pp=4, mbs=1, rampup=None), "megatron-deepspeed", "bigscience",
     "attention heads 112 are not divisible by TP 3"),
    ("zero2-pp-bigscience", bloom(zero=2), "megatron-deepspeed", "bigscience", "ZeRO-2 is refused"),
    ("zero3-pp-microsoft", gpt3(zero=3), "megatron-deepspeed", "microsoft", "ZeRO-3 with PP=8 is refused"),
    ("sp-tp1", llama("llama2-7b", gpus=16, tp=1, pp=2, dp=8, gas=128), "megatron-deepspeed", "microsoft",
     "sequence parallelism needs TP > 1"),
    ("selective-bigscience", bloom(recompute="selective"), "megatron-deepspeed", "bigscience",
     "cannot express selective recompute"),
    ("sp-bigscience", replace(gpt3(), candidate=replace(gpt3().candidate, sp=True)), "megatron-deepspeed",
     "bigscience", "cannot express sequence parallelism"),
    ("gqa-bigscience", llama(recompute="full", sp=False), "megatron-deepspeed", "bigscience",
     "cannot express grouped-query attention"),
    ("flash-bigscience", bloom(flash_attention=True), "megatron-deepspeed", "bigscience", "FlashAttention"),
    ("alibi-microsoft", bloom(), "megatron-deepspeed", "microsoft", "cannot express ALiBi"),
    ("vpp-deepspeed", gpt3(vpp=2), "megatron-deepspeed", "microsoft", "virtual pipeline (vpp=2)"),
    ("hybrid-megatron", gpt3(hybrid=True), "megatron-deepspeed", "microsoft", "hybrid sharding is an FSDP"),
    ("layers-pp-megatron-lm", llama(pp=32, dp=1, gas=1024), "megatron-lm", "bigscience",
     "80 layers cannot be split over PP 32"),
    ("zero3-megatron-lm", gpt3(zero=3), "megatron-lm", "bigscience",
     "Megatron-FSDP, which composes with TP, CP and EP, not with PP"),
    ("zero1-fsdp", llama("llama2-7b", gpus=16, tp=1, pp=1, dp=16, gas=64, zero=1, sp=False), "fsdp", "bigscience",
     "FSDP has no ZeRO-1"),
    ("gpt-torchtitan", replace(gpt3(tp=1, pp=1, dp=128, gas=12, zero=3), training=replace(
        gpt3().training, rampup=None)), "fsdp", "bigscience", "torchtitan (--emit fsdp) cannot express learned absolute positions"),
    ("bf16-v100", replace(GPT3_NO_RAMPUP, cluster=make_cluster(gpu="V100-32GB", gpus=128)), "megatron-deepspeed",
     "bigscience", "V100-32GB has no bf16"),
    ("optimizer", replace(gpt3(), training=replace(gpt3().training, optimizer="lion")), "megatron-deepspeed",
     "bigscience", "optimizer 'lion' has no Megatron flag"),
    ("seq-len", replace(gpt3(), training=replace(gpt3().training, seq_len=4096)), "megatron-deepspeed",
     "bigscience", "sequence length 4096 exceeds the model's 2048"),
    ("rampup-increment", replace(gpt3(), training=replace(gpt3().training, rampup=Rampup(start=16, increment=7,
                                                                                           samples=1000))),
     "megatron-deepspeed", "bigscience", "is not divisible by increment 7"),
    ("zero-tp", gpt3(tp=0), "megatron-deepspeed", "bigscience", "layout sizes must be positive integers, got tp=0"),
    ("unknown-kind", gpt3(), "nemo", "bigscience", "unknown emitter kind 'nemo'"),
    ("unknown-flavor", gpt3(), "megatron-deepspeed", "nvidia", "unknown Megatron-DeepSpeed flavor 'nvidia'"),
]
