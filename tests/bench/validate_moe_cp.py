"""Predicted vs published throughput for context-parallel, MoE and FP8 runs (issue 14).

    python tests/bench/validate_moe_cp.py

(Its MoE and dense rows beside the other dev tables', issue 33's criterion: tests/bench/moe_vs_dense.py.)

Each row is a published layout; the planner scores that exact layout (TP, PP, CP, DP, EP, VP, MBS, GBS) and
reports the best of recompute none/selective/full and ZeRO 0/1 that fits, against the published throughput:
tokens/s per GPU where the source gives it (Megatron-Bridge), else model TFLOP/s per GPU (Llama 3). Tokens/s does
not depend on how FLOPs are counted: Megatron-Bridge's TFLOP/s count causal attention as half the s^2 work and add
the MTP layer (Megatron-Bridge src/megatron/bridge/training/utils/flop_utils.py: ``core_seq / 2``, ``mtp_num_layers``),
plantune's count the full s^2 (Narayanan et al. 2021), so their TFLOP/s ratio is not a time ratio. Sources:
- Llama 3: Dubey et al. 2024 (arXiv 2407.21783) Table 4 (BF16, H100, 16M-token batches).
- Megatron-Bridge: NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md, 25.11 container, DGX-H100 and
  DGX-B200 pre-training tables (FP8 current scaling on H100, MXFP8 on B200; MoE runs force-balanced, dropless).
  Its DGX-H100 Qwen3-235B-A22B row (EP 32: the all-to-all crosses 4 nodes over InfiniBand) lacks its GBS cell; GBS
  2048 and TP2/PP8/VP4/EP32 are QWEN3_235B_A22B_H100_FP8_CS_PARALLEL_CONFIG in
  scripts/performance/configs/qwen3/workload_base_configs.py.
  Its GB200 rows are left out: they were written before the NVL72 domain was modelled (now --cluster gb200-nvl72;
  NeMo's GB200 rows are scored by tests/bench/validate_blackwell.py), and its DeepSeek-V3 PP4 x VP4 split of 61
  layers needs --pipeline-model-parallel-layout, which plan does not search.
The MoE host costs (planner.constants KERNEL_LAUNCH_S, MOE_ROUTER_HOST_S) are FITTED on the MoE rows here and in
validate_blackwell.py, each with the CUDA graphs its source states (PUBLISHED_CUDA_GRAPHS: the B200 Qwen3-30B-A3B row's
moe_router + moe_preprocess graphs, planner.cuda_graphs).
Megatron-Bridge rows run as its perf scripts do (scripts/performance/configs/*/*_llm_pretrain.py at 25.11,
da980700a): ``grad_reduce_in_fp32 = False`` (plan: grad_reduce_dtype bf16, Megatron-LM --grad-reduce-in-bf16) and, on H100,
``fp8_cs`` = bf16_with_fp8_current_scaling_mixed (fp8_recipe "tensorwise", fp8_param_gather True); the B200 rows'
MXFP8 is planned as --fp8-recipe mxfp8 (block-scaled: planner.fp8.BLOCK_SCALING; delayed scaling before it existed).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

ROWS = [  # source, model, gpu, GPUs, precision, GBS, MBS, seq, TP, PP, CP, VP, EP, published TFLOP/s/GPU, tokens/s/GPU
    ("Llama 3 Table 4", "llama3-405b", "H100", 8192, "bf16", 2048, 1, 8192, 8, 16, 1, None, 1, 430, None),
    ("Llama 3 Table 4", "llama3-405b", "H100", 16384, "bf16", 2048, 1, 8192, 8, 16, 1, None, 1, 400, None),
    ("Llama 3 Table 4", "llama3.1-405b", "H100", 16384, "bf16", 128, 1, 131072, 8, 16, 16, None, 1, 380, None),
    ("Megatron-Bridge 25.11 H100", "llama3-70b", "H100", 64, "fp8", 128, 1, 8192, 4, 8, 1, 5, 1, 719, 1602),
    ("Megatron-Bridge 25.11 H100", "llama3.1-405b", "H100", 1024, "fp8", 512, 1, 8192, 8, 8, 2, 8, 1, 737, 292),
    ("Megatron-Bridge 25.11 H100", "qwen3-30b-a3b", "H100", 16, "fp8", 512, 2, 4096, 1, 2, 1, 24, 8, 121, 5275),
    ("Megatron-Bridge 25.11 H100", "qwen3-235b-a22b", "H100", 256, "fp8", 2048, 1, 4096, 2, 8, 1, 4, 32, 233, 1575),
    ("Megatron-Bridge 25.11 B200", "deepseek-v3", "B200", 256, "fp8", 2048, 1, 4096, 1, 16, 1, 1, 8, 557, 2139),
    ("Megatron-Bridge 25.11 B200", "qwen3-30b-a3b", "B200", 8, "fp8", 512, 1, 4096, 1, 1, 1, 1, 8, 214, 9299),
    ("DeepSeek-V3 report Sec. 1/3.2", "deepseek-v3", "H800", 2048, "fp8", 15360, 1, 4096, 1, 16, 1, 1, 64, None,
     1543),
]
# DeepSeek-V3's own run (DeepSeek-AI 2024, arXiv 2412.19437): 2,048 H800 (Sec. 3.1), "16-way Pipeline Parallelism,
# 64-way Expert Parallelism spanning 8 nodes, and ZeRO-1 Data Parallelism" with no TP (Sec. 3.2), DualPipe (Sec.
# 3.2.1), FP8 with 1x128 / 128x128 block scaling (Sec. 3.3: plan's --fp8-recipe blockwise), RMSNorm and MLA
# up-projections recomputed (Sec. 3.2.3: modules layernorm + mla_up_proj), batch 15,360 sequences of 4,096 tokens
# after the ramp (Sec. 4.2). Throughput: "each trillion tokens requires only 180K H800 GPU hours" (Sec. 1, Table 1),
# 1e12 / (180e3 x 3600) = 1,543 tokens/s per GPU. The micro-batch is not published: MBS 1 and 2 are scored (GAS 120,
# 60: even and >= 2 x PP, as DualPipe needs), and the faster that fits is shown. The 20 SMs its all-to-all kernels take
# (Sec. 3.2.2) slow the merged chunks' compute (planner.dualpipe.overlapped_compute_factor); its node-limited routing
# (each token to at most 4 nodes, Sec. 2.1.2) is not modelled, nor its layer split (plan takes Megatron's).
# Its low-precision recipe (Sec. 3.3.3): activations cached in FP8 (attention output E5M6, SwiGLU inputs in FP8 with the
# output recomputed) and dispatched in FP8 (plan's --fp8-activations deepseek), AdamW's moments in BF16
# (--optimizer-state-dtype bf16), FP32 master weights and gradient accumulation (Megatron's main grads: fp32).
PUBLISHED_PP_SCHEDULE = {("deepseek-v3", "H800"): "DualPipe"}
PUBLISHED_FP8_ACTIVATIONS = {("deepseek-v3", "H800"): "deepseek"}
PUBLISHED_OPTIMIZER_STATE_DTYPE = {("deepseek-v3", "H800"): "bf16"}
PUBLISHED_MBS_CHOICES = {("deepseek-v3", "H800"): (1, 2)}

# Recompute the Megatron-Bridge runs used where plan has the mode (same scripts): none for Llama 3 70B / 3.1 405B on H100
# (no recompute_* in their workload configs) and Qwen3-30B-A3B (set_qwen3_common_configs: recompute_granularity None).
# DeepSeek-V3 B200 recomputes only the MLA up-projections (recompute_modules=["mla_up_proj"]: plan's
# modules:mla_up_proj); the Llama 3 rows take the best of none/selective/full (the paper does not say).
# The runs' EP all-to-all overlap (moe_a2a_overlap in Megatron-Bridge scripts/performance/configs/qwen/
# qwen3_workload_base_configs.py and deepseek/deepseek_workload_base_configs.py): on for Qwen3-235B-A22B on H100,
# off for Qwen3-30B-A3B on H100 and DeepSeek-V3 on B200 (V1), not set (off) for Qwen3-30B-A3B on B200. The H100
# Qwen3-30B-A3B row's table cells (MBS 2, GA 32) are its config before 2025-11-21 (commit 87aa39ce7:
# micro_batch_size=2, no moe_a2a_overlap); from 8aed9a229 on the config sets MBS 1 and the overlap, which the
# published row's GA 32 rules out. Shared-expert overlap: DeepSeekProvider (src/megatron/bridge/models/deepseek/
# deepseek_provider.py at v0.2.1) sets moe_shared_expert_overlap=True, which the B200 config (moe_a2a_overlap=False,
# so no set_moe_a2a_overlap_overrides) keeps: plan's --overlap shared-expert.
PUBLISHED_A2A_OVERLAP = {("qwen3-235b-a22b", "H100")}
PUBLISHED_SHARED_EXPERT_OVERLAP = {("deepseek-v3", "B200")}
# CUDA graphs as the 25.11 container's Megatron-Bridge (v0.2.0, 2025-11-26; the same at da980700a and v0.2.1) sets
# them in scripts/performance/configs/qwen3/workload_base_configs.py: QWEN3_30B_A3B_B200_FP8_CS_BASE_CONFIG (which
# FP8_MX aliases) cuda_graph_impl="transformer_engine", cuda_graph_scope=["moe_router", "moe_preprocess"]. The other
# Bridge rows' configs set no cuda_graph_impl (Qwen3-30B-A3B H100 FP8_CS, Qwen3-235B-A22B H100, DeepSeek-V3 B200 in
# deepseek/workload_base_configs.py, the Llama 3 H100 rows in llama3/workload_base_configs.py): eager. (Before
# 2025-11-21, 87aa39ce7, the B200 Qwen3 config had cuda_graph_impl="local", scope full_iteration.)
PUBLISHED_CUDA_GRAPHS = {("qwen3-30b-a3b", "B200"): ("moe_router", "moe_preprocess")}
PUBLISHED_RECOMPUTE = {("llama3-70b", "H100"): "none", ("llama3.1-405b", "H100"): "none",
                       ("qwen3-30b-a3b", "H100"): "none", ("qwen3-30b-a3b", "B200"): "none",
                       ("qwen3-235b-a22b", "H100"): "none", ("deepseek-v3", "B200"): "modules:mla_up_proj",
                       ("deepseek-v3", "H800"): "modules:layernorm+mla_up_proj"}


def qwen3_235b_a22b():
    """Qwen3-235B-A22B as its HF config.json gives it (94 layers, hidden 4096, 64/4 heads, head_dim 128, 128 experts
    of 1536, top-8, vocab 151936): no preset, the one multi-node expert-parallel row (EP 32 over 4 DGX-H100 nodes)."""
    from dataclasses import replace

    from planner import load_model

    return replace(load_model("qwen3-30b-a3b"), name="qwen3-235b-a22b", layers=94, hidden=4096, heads=64, kv_heads=4,
                   ffn_hidden=12288, moe_ffn_hidden=1536, kv_channels=128, seq_len=40960,
                   source="HF Qwen/Qwen3-235B-A22B config.json")


def predict(model: str, gpu: str, gpus: int, precision: str, gbs: int, mbs: int, seq: int, tp: int, pp: int,
            cp: int, vp: int | None, ep: int, *, fp8_recipe: str = "delayed",
            grad_reduce_dtype: str = "fp32", recompute: str | None = None,
            a2a_overlap: bool = False, shared_expert_overlap: bool = False,
            cuda_graphs: tuple[str, ...] = (), pp_schedule: str = "",
            mbs_choices: tuple[int, ...] = (), fp8_activations: str = "te",
            optimizer_state_dtype: str = "fp32") -> tuple[float, float, str] | None:
    """(model TFLOP/s per GPU, tokens/s per GPU, what was chosen) of the best fitting variant, or None; with
    ``recompute`` (the published one) that mode only, marked "predicted OOM" where plan says it does not fit."""
    from planner import load_model, make_cluster
    from planner.rank import estimate
    from planner.space import Candidate, TrainingSpec

    m = qwen3_235b_a22b() if model == "qwen3-235b-a22b" else load_model(model)
    cluster = make_cluster(gpu=gpu, gpus=gpus)
    t = TrainingSpec(global_batch=gbs, seq_len=seq, precision=precision, framework="megatron-lm", fp8_recipe=fp8_recipe,
                     grad_reduce_dtype=grad_reduce_dtype, cuda_graphs=cuda_graphs, pp_schedule=pp_schedule,
                     fp8_activations=fp8_activations, optimizer_state_dtype=optimizer_state_dtype,
                     overlap=("grad-reduce", "param-gather", "p2p") + (("ep-a2a",) if a2a_overlap else ())
                     + (("shared-expert",) if shared_expert_overlap else ()))
    dp = gpus // (tp * pp * cp)
    best = None
    for mode in (recompute,) if recompute else ("none", "selective", "full"):
        for zero in (0, 1):
            for vpp, mb in ((v, b) for v in ([vp] if vp else [1, 2, 4, 8]) for b in (mbs_choices or (mbs,))):
                c = Candidate(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, mbs=mb, gas=gbs // (mb * dp), recompute=mode,
                              zero=zero, sp=tp > 1, vpp=vpp)
                e = estimate(m, cluster, t, c)
                oom = any(v.reason.value.startswith("memory") for v in e.reasons)
                if e.throughput and (recompute or not oom):
                    tf, tok = e.throughput.model_tflops_per_gpu, e.throughput.tokens_per_s / gpus
                    better = best is None or (oom, -tf) < (best[3], -best[0])
                    if better:
                        best = (tf, tok, f"recompute={mode} zero={zero} vpp={vpp}"
                                    + (f" mbs={mb}" if mbs_choices else "") + f" {e.memory.total_gb:.0f} GB"
                                    + (f" [{', '.join(v.reason.value for v in e.reasons)}]" if e.reasons else "")
                                    + (" predicted OOM (published ran)" if oom else ""), oom)
    return best[:3] if best else None


def score(row: tuple) -> tuple[str, float, float, str]:
    """(unit, published, predicted, what was chosen) of one of `ROWS`, scored as its source ran it."""
    src, model, gpu, gpus, prec, gbs, mbs, seq, tp, pp, cp, vp, ep, pub_tf, pub_tok = row
    bridge = src.startswith("Megatron-Bridge")
    deepseek = src.startswith("DeepSeek")
    best = predict(model, gpu, gpus, prec, gbs, mbs, seq, tp, pp, cp, vp, ep, grad_reduce_dtype="bf16" if bridge else "fp32",
                   fp8_recipe=("tensorwise" if gpu == "H100" else "mxfp8") if bridge else
                   "blockwise" if deepseek else "delayed",
                   recompute=PUBLISHED_RECOMPUTE.get((model, gpu)) if bridge or deepseek else None,
                   pp_schedule=PUBLISHED_PP_SCHEDULE.get((model, gpu), ""),
                   fp8_activations=PUBLISHED_FP8_ACTIVATIONS.get((model, gpu), "te"),
                   optimizer_state_dtype=PUBLISHED_OPTIMIZER_STATE_DTYPE.get((model, gpu), "fp32"),
                   mbs_choices=PUBLISHED_MBS_CHOICES.get((model, gpu), ()),
                   a2a_overlap=(model, gpu) in PUBLISHED_A2A_OVERLAP,
                   shared_expert_overlap=(model, gpu) in PUBLISHED_SHARED_EXPERT_OVERLAP,
                   cuda_graphs=PUBLISHED_CUDA_GRAPHS.get((model, gpu), ()) if bridge else ())
    tf, tok, note = best if best else (float("nan"), float("nan"), "does not fit")
    unit, pub, pred = ("tokens/s", pub_tok, tok) if pub_tok else ("TFLOP/s", pub_tf, tf)
    return unit, pub, pred, note


def main() -> int:
    print(f"{'source':28} {'model':15} {'GPUs':>10} {'prec':5} {'TP/PP/CP/EP':12} {'unit':9} {'published':>9} "
          f"{'predicted':>9} {'ratio':>6}  chosen")
    ratios, oom_rows = [], 0
    for row in ROWS:
        src, model, gpu, gpus, prec, gbs, mbs, seq, tp, pp, cp, vp, ep, pub_tf, pub_tok = row
        unit, pub, pred, note = score(row)
        ratios.append(pred / pub)
        oom_rows += "predicted OOM" in note
        print(f"{src:28} {model:15} {gpu + 'x' + str(gpus):>10} {prec:5} {f'{tp}/{pp}/{cp}/{ep}':12} {unit:9} "
              f"{pub:9.0f} {pred:9.0f} {pred / pub:6.2f}  {note}")
    fitted = [r for r in ratios if r == r]
    print(f"\npredicted/published: {len(fitted) - oom_rows} of {len(ratios)} rows fit as published; geometric mean "
          f"{math.exp(sum(map(math.log, fitted)) / len(fitted)):.2f}, worst "
          f"{max(fitted, key=lambda r: abs(math.log(r))):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
