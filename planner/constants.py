"""The one table of the cost model's fitted constants: value, unit, source, what it was fitted on, checked on.

A constant belongs here when its value was chosen to match measurements (by hand, by eye or by a fit) rather than
read off a datasheet, a paper's equation or a framework's source. Facts with a source (tile sizes, bytes per
element, framework defaults) stay beside the formula that uses them. Declare a new fitted constant as one more
`Fitted` row of `TABLE` and bind its name below the table; a term (`planner.terms.Term.constants`) names the
constants it reads, so `plan --explain --format json` can show them with the term.

Pure data: no planner imports, so every module of planner/ may read it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Fitted:
    """A fitted constant: its value and unit, the physics it stands in for, what it was fitted and checked on."""

    name: str
    value: float
    unit: str
    source: str
    """what the form of the constant comes from (the physics it stands in for)"""
    fitted_on: str
    checked_on: str

    def to_dict(self) -> dict:
        return {"name": self.name, "value": self.value, "unit": self.unit, "source": self.source,
                "fitted_on": self.fitted_on, "checked_on": self.checked_on}


_DEV = "the dev tables (tests/bench/validate.py)"

TABLE: tuple[Fitted, ...] = (
    # -- compute (planner.cost) --
    Fitted(name="GEMM_K_HALF", value=64, unit="elements of the inner dimension",
           source="k / (k + GEMM_K_HALF): short inner dimensions cannot hide load latency (NVIDIA 'Matrix "
                  "Multiplication Background' user guide)",
           fitted_on="by hand on Megatron-LM 2021 Table 1 and Korthikanti 2022 Table 5 (small-hidden rows)",
           checked_on="seed 003 (hidden 2048)"),
    Fitted(name="DENSE_MISALIGNED_EFFICIENCY", value=0.5, unit="fraction of the aligned GEMM's rate",
           source="dense GEMMs with an odd-sized dimension run at about half speed (karpathy/nanoGPT model.py: "
                  "50257 -> 50304 vocabulary ~25% faster training)",
           fitted_on="by hand on nanoGPT's figure",
           checked_on="the DeepSpeed autotuning HF GPT-2 dev tables"),
    Fitted(name="ELEMENTWISE_BW_EFFICIENCY", value=0.7, unit="fraction of HBM bandwidth",
           source="element-wise kernels are HBM-bound; copy kernels reach 80-90% of peak (BabelStream on V100/A100)",
           fitted_on="by hand on seed 003's V100 tables (no-recompute vs recompute rows) and Korthikanti 2022 Table 5",
           checked_on=_DEV),
    Fitted(name="SHARDED_OVERLAP", value=0.8, unit="largest hidden share of the ZeRO-3/FSDP gathers",
           source="FSDP forward/backward prefetch overlaps the next all-gather with this layer's compute "
                  "(Zhao et al. 2023, arXiv 2304.11277 Sec. 3.3)",
           fitted_on="by hand on the torchtitan and fms-fsdp dev tables and Narayanan 2021 Table 2 ZeRO-3 rows",
           checked_on=_DEV),
    Fitted(name="RANKING_ERROR", value=0.10, unit="relative step time",
           source="candidates closer than the model's error inside one table are tied",
           fitted_on="an upper bound on the sd of log(predicted/measured) inside a table over the 30 dev tables "
                     "(tests/bench/validate.py's summary: 'spread of predicted/measured inside a table')",
           checked_on=_DEV),
    # -- communication (planner.topology) --
    Fitted(name="LINK_EFFICIENCY", value=0.75, unit="fraction of a datasheet link bandwidth",
           source="NCCL bus bandwidth at large messages (nccl-tests PERFORMANCE.md)",
           fitted_on="by hand on Megatron-LM 2021 Table 1 and Korthikanti 2022 Table 5 (the TP/DP terms)",
           checked_on=_DEV + "; never applied to a measured bus bandwidth"),
    Fitted(name="HALF_BANDWIDTH_BYTES_INTRA", value=8e6, unit="bytes",
           source="message size at half the asymptotic bus bandwidth: the pipelining term of an alpha-beta model "
                  "(Hockney 1994)",
           fitted_on="by eye on nccl-tests all_reduce curves of DGX A100 NVLink (half plateau at 4-8 MB)",
           checked_on=_DEV),
    Fitted(name="HALF_BANDWIDTH_BYTES_INTER", value=8e6, unit="bytes",
           source="as HALF_BANDWIDTH_BYTES_INTRA, across nodes",
           fitted_on="by eye on nccl-tests all_reduce curves of DGX A100 HDR InfiniBand",
           checked_on=_DEV),
    Fitted(name="COLLECTIVE_LATENCY_S_INTRA", value=20e-6, unit="s per collective",
           source="alpha of the alpha-beta model (Hockney 1994)",
           fitted_on="by eye on nccl-tests small-message curves (NVLink)", checked_on=_DEV),
    Fitted(name="COLLECTIVE_LATENCY_S_INTER", value=40e-6, unit="s per collective",
           source="alpha of the alpha-beta model (Hockney 1994)",
           fitted_on="by eye on nccl-tests small-message curves (InfiniBand)", checked_on=_DEV),
    # -- framework behaviour (planner.framework) --
    Fitted(name="DS_MICROBATCH_OVERHEAD_S", value=0.04, unit="s per micro-batch and pipeline stage (TP > 1)",
           source="DeepSpeed runtime/pipe/engine.py (v0.5.4+): activations and their gradients sent partitioned over "
                  "TP (a meta tensor, the slice, an all-gather on the receiver, PartitionedTensor.from_meta's "
                  "meta.tolist() device-to-host sync in the forward and in RecvGrad)",
           fitted_on="the BLOOM tr11 dev tables (chronicles-prequel 02-20..24, all TP8: MBS sweeps at fixed PP/DP and "
                     "the PP 4-12 sweep) jointly with DS_DP_INTER_NODE_EFFICIENCY, after planner.pipeline_engine's "
                     "schedule (blocking p2p, both directions partitioned, end stages carrying each message once, "
                     "the bubble as one pass of every stage), fp16 gradient accumulation and 256x128 GEMM tiles "
                     "(python tests/bench/validate.py over 0.02-0.06 s x 0.20-0.40): at efficiency 0.33, tr11 error "
                     "7.0 / 6.8 / 6.7 / 6.5% at 0.035 / 0.0375 / 0.04 / 0.0475 s; bounded above by the 48-node "
                     "PP12/DP4 MBS sweep's MBS 1 / MBS 4 step ratio (1.16 measured; 1.20 / 1.21 / 1.23 predicted at "
                     "0.0375 / 0.04 / 0.0475 s, tests/test_framework_cost.py) and below by BLOOM's own layout coming "
                     "first on its cluster (from 0.0375 s). The value also carries the tr11 tables' level: fitted to "
                     "their shape alone (a free per-step offset, tr11 48-node rows) the per-slot cost is 6 +- 6 ms and "
                     "the offset ~11 s a step, which no term explains yet",
           checked_on="BLOOM's own run (TP4 PP12 MBS2 bf16 on 384 A100, 104.70 s logged): 108.2 s predicted; MT-NLG "
                      "530B (DeepSpeed's engine, TP8 PP35): 1.0% error (one-MFU floor 3.6%); only with TP > 1: seed "
                      "003's TP1 pipelines (1.3B, PP 2-8, up to 519 micro-batch slots a step) leave no room for a "
                      "per-micro-batch cost at TP1 (planner.pipeline_engine), and the partitioned path exists only "
                      "with TP > 1"),
    Fitted(name="EAGER_HOST_S", value=4e-3, unit="s of host time per layer forward",
           source="eager Hugging Face blocks launch ~40 small kernels per layer forward, ~100 us each with Python "
                  "and autograd",
           fitted_on="the DeepSpeed autotuning HF GPT-2 dev tables (0.12B-1.5B on 16 V100, step times nearly flat "
                     "in the micro-batch)",
           checked_on="the torchtitan and fms-fsdp dev tables"),
    Fitted(name="MEGATRON_HOST_S", value=4e-3 / 3, unit="s of host time per layer forward",
           source="Megatron's fused layer launches a third as many kernels as an eager block: EAGER_HOST_S / 3",
           fitted_on="derived from EAGER_HOST_S by the kernel count", checked_on=_DEV),
    Fitted(name="DS_DP_INTER_NODE_EFFICIENCY", value=0.33, unit="fraction of the ring model's rate",
           source="DeepSpeed ZeRO-1/2 under the pipeline engine reduces bucket by bucket, synchronously",
           fitted_on="the BLOOM tr11 dev tables (the PP 4-12 sweep at TP8: larger DP reductions across 48 nodes; "
                     "the PP 6 / DP 8 rows against the PP 12 / DP 4 rows of each model shape), jointly with "
                     "DS_MICROBATCH_OVERHEAD_S (its fitted_on): tr11 error 7.7 / 7.0 / 6.7 / 6.2% at 0.40 / 0.35 / "
                     "0.33 / 0.30 (0.04 s); regret of the tables' picks 0.8% mean from 0.33 up, 1.5% (one 23% pick) "
                     "at 0.30 and below",
           checked_on="all 9 tr11 model shapes pick within 1%"),
    # -- torchtitan (planner.fsdp_parallel, planner.fp8) --
    Fitted(name="ASYNC_TP_HIDDEN", value=0.21, unit="share of the TP collectives hidden",
           source="async TP: torch.compile's micro-pipelining decomposes each all-gather + matmul and matmul + "
                  "reduce-scatter into chunked p2p overlapped with the partial matmuls (torch/distributed/"
                  "_symmetric_memory, torchtitan docs/async_tp.md)",
           fitted_on="torchtitan's Dec-2024 Table 4 (Llama 3.1 70B, TP8 x FSDP32 on 256 H100, 829 -> 876 tokens/s "
                     "per GPU with async TP, +5.7%; predicted +5.8%), the one pair of rows that differ only in it, at "
                     "the rows' 500 W cap (planner/accelerators.yaml H100-HBM2e-96GB)",
           checked_on="no other published pair"),
    Fitted(name="ROWWISE_GEMM_EFFICIENCY", value=0.94, unit="x the FP8 GEMMs' usual rate (torchao rowwise float8)",
           source="a scale per row of each GEMM operand: row-scaled epilogues (torch._scaled_mm rowwise)",
           fitted_on="MEASURED: torch._scaled_mm on an H200, torch 2.11 (cuBLAS), Llama 3 8B's four layer GEMMs at "
                     "8192 tokens: rowwise 1,235 vs tensorwise 1,314 TFLOP/s (tests/bench/fp8_rowwise_gemm.py)",
           checked_on="torchtitan commit 7a04053 (Llama 3 8B, 8 H100, torch.compile, Jan 2025): rowwise / "
                      "tensorwise = 6,424 / 7,186 = 0.894 end to end"),
    Fitted(name="BLOCK_SCALED_GEMM_EFFICIENCY", value=0.92,
           unit="x the FP8 GEMMs' usual rate (block-scaled FP8: --fp8-recipe mxfp8, blockwise)",
           source="a scale per 32 (MX) or 128 (DeepSeek-V3) elements of K for each operand row: the GEMM loads the "
                  "scales with every K-block and applies them before accumulating (Blackwell tcgen05 block-scaled MMA; "
                  "on Hopper, DeepSeek-V3 Sec. 3.3.2's promotion to FP32 every 128 elements); the quantization passes "
                  "are costed apart (planner.fp8.cast_traffic_bytes)",
           fitted_on="torchao's B200 table (docs/source/workflows/training.md @ 36027d8, Llama 3 8B, FSDP2 on 8 B200): "
                     "mxfp8_cublas / float8 tensorwise = 9,969 / 10,417 = 0.957 end to end; predicted 0.991 at 1.0, "
                     "0.957 at 0.92 (tests/test_blackwell.py)",
           checked_on="torchtitan nvfp4.md @ b5bcd76 (4 Blackwell GPUs, ASSUMED GB200): MXFP8 / BF16 Llama 3 8B 1.281 "
                      "measured, 1.447 -> 1.382 predicted; Qwen3 8B 1.319 measured, 1.416 -> 1.356 predicted. No "
                      "published blockwise (128x128) pair here: blockwise takes MXFP8's value"),
    # -- MoE (planner.moe) --
    Fitted(name="KERNEL_LAUNCH_S", value=40e-6, unit="s of host time per grouped-GEMM split launch",
           source="Transformer Engine GroupedLinear: one cuBLAS call (and under FP8 each quantization's kernels, "
                  "planner.moe.QUANTIZE_KERNELS) per expert split, launched after the MoE dispatcher's host sync; "
                  "of the order of MEGATRON_HOST_S per kernel of a fused layer (EAGER_HOST_S: ~100 us a kernel); "
                  "also one graph replay's launch (planner.cuda_graphs)",
           fitted_on='the six Megatron-Core dropless MoE rows of tests/bench/validate_moe_cp.py and validate_blackwell.py, jointly with MOE_ROUTER_HOST_S, each row with the CUDA graphs its source states (planner.cuda_graphs: only the DGX-B200 Qwen3-30B-A3B row, moe_router + moe_preprocess, Megatron-Bridge v0.2.0 = 25.11): pred/meas H100 Qwen3-30B-A3B, H100 Qwen3-235B-A22B, B200 DeepSeek-V3, B200 Qwen3-30B-A3B (graphed), GB200 Mixtral 8x7B, GB200 Llama 4 Scout = 1.15 0.96 1.04 0.78 1.05 1.00 at 40 us / 1.5 ms (geometric mean 0.99, mean abs error 8.2%); 50 us / 0 ms 1.13 1.10 1.01 0.67 1.18 1.02 (12.8%); 40 us / 1.25 ms 9.3%, 40 / 1.75 8.2% (0.96), 35 / 1.5 9.2%, 45 / 1.5 8.0% (0.95). The eager rows alone cannot split the two (their router work hides under the GPU where the post-sync launches cannot); the graphed row, whose router is replayed as one graph, does. Fitted before MEGATRON_CHUNK_HOST_S and not refit with it (with it the six rows give 1.06 0.92 1.03 0.78 1.04 1.00)',
           checked_on="no MoE row left out of the fit; it was 50 us fitted on the two eager rows H100 Qwen3-30B-A3B "
                      "and B200 DeepSeek-V3 before MOE_ROUTER_HOST_S and CUDA graphs, 20 us on the graphed row alone"),
    Fitted(name="MOE_ROUTER_HOST_S", value=1.5e-3, unit="s of host time per MoE layer forward",
           source="Megatron-Core's router and dispatcher preprocess (router.py TopKRouter: scores, top-k, aux / z "
                  "losses, force-balancing; token_dispatcher.py preprocess: token counts, splits, permutation), launched "
                  "before the dropless dispatcher's host sync: what --cuda-graph-scope moe_router moe_preprocess "
                  "replaces by one graph launch (planner.cuda_graphs; Megatron-Core MoE, arXiv 2603.07685: host-bound "
                  "fine-grained MoE)",
           fitted_on="jointly with KERNEL_LAUNCH_S, on the same six rows",
           checked_on="no MoE row left out of the fit"),
    Fitted(name="MEGATRON_CHUNK_HOST_S", value=1.1e-3,
           unit="s of host time per model-chunk pass (a chunk's forward, or its backward) of Megatron's schedule",
           source="Megatron-LM's pipeline schedules run per model chunk and micro-batch, in Python, a forward_step / "
                  "backward_step (the model's wrappers, autograd's backward call) and the P2P posts (megatron/core/"
                  "pipeline_parallel/schedules.py forward_step_helper / backward_step_helper, pp_post_forward / "
                  "pp_post_backward: p2p_communication send_forward_recv_forward); a layer pays its share, chunks / "
                  "layers on the rank (VPP / (layers / PP); 1 a layer at Qwen3-30B-A3B's PP2 x VP24). On the host's "
                  "critical path only where the dropless dispatcher's host sync keeps the host from running ahead "
                  "(planner.ops.LayerOps.exposed_chunk_s)",
           fitted_on="the seven MoE runs of tests/bench/moe_vs_dense.py (validate_moe_cp.py's five, validate_"
                     "blackwell.py's GB200 Mixtral 8x7B and Llama 4 Scout), least squares on log(pred/published) "
                     "with KERNEL_LAUNCH_S and MOE_ROUTER_HOST_S kept: 0 / 0.5 / 0.75 / 1.0 / 1.1 / 1.15 / 1.25 / 1.5 "
                     "ms give rms log 0.1096 / 0.1058 / 0.1046 / 0.1040 / 0.10395 / 0.10394 / 0.1040 / 0.1045 (flat "
                     "from 1.05 to 1.2 ms; 1.1 taken), MoE mean abs error 7.6 / 7.2 / 7.0 / 6.8 / 6.7 / 6.7 / 6.6 / "
                     "6.4%; at 1.1 ms pred/pub "
                     "H100 Qwen3-30B-A3B 1.146 -> 1.063, H100 Qwen3-235B-A22B 0.961 -> 0.916, B200 DeepSeek-V3 1.044 "
                     "-> 1.027, B200 Qwen3-30B-A3B 0.785 -> 0.782, the rest unchanged. Only the H100 Qwen3-30B-A3B "
                     "row (one layer a chunk) pulls it up; Qwen3-235B-A22B (about 3) pulls it down",
           checked_on="the dense Megatron rows with one or two layers a chunk, where no sync exposes it: at 1.1 ms a "
                      "chunk forward, NeMo 24.07 Llama 2 70B (TP4 PP4 VP20) and NeMo GB200 GPT-3 175B / Nemotron-4 "
                      "340B (VP12) have 0.97 / 0.98 / 1.48 ms a chunk forward of GPU compute and TP all-reduce over "
                      "plan's host time, so even there it would be mostly hidden; charged to every Megatron layer "
                      "under the per-layer max they would drop 1.01 -> 0.95, 1.03 -> 0.93, 1.03 -> 0.96, which the "
                      "runs do not show"),
    Fitted(name="FLEX_LINK_EFFICIENCY", value=0.9, unit="fraction of a datasheet link bandwidth",
           source="DeepEP's normal (training) dispatch and combine kernels drive NVLink and RDMA near their peak: "
                  "TMA / NVSHMEM copies with a chosen number of SMs, no NCCL protocol (planner.moe.DISPATCHERS)",
           fitted_on="by hand on DeepEP's README table (H800, 4096 tokens, hidden 7168, top-8): intranode EP8 153 / "
                     "158 GB/s of ~160 GB/s NVLink (0.96-0.99), internode EP16-64 43-46 GB/s of ~50 GB/s RDMA "
                     "(0.86-0.92)",
           checked_on="no published training run here pairs DeepEP with the alltoall dispatcher"),
    # -- memory (planner.memory) --
    Fitted(name="ALLOCATOR_OVERHEAD", value=1.05, unit="x the dynamic (activation, logits) bytes",
           source="PyTorch's caching allocator holds more than the live tensors (block rounding, fragmentation): "
                  "Megatron's 'max reserved' a few percent above 'max allocated'",
           fitted_on="by hand on Megatron's memory reports",
           checked_on="tests/test_memory_published.py"),
    Fitted(name="DEEPSPEED_FP16_RESERVED_BYTES", value=2.0,
           unit="bytes a parameter (sharded with the gradients), reserved but not live",
           source="DeepSpeed's fp16 ZeRO optimizer keeps 16-bit gradients only (runtime/zero/stage_1_and_2.py; the "
                  "fp32 copy is the step's partition, 4/N), yet its runs' nvidia-smi peaks follow the 18-byte rule's "
                  "4 bytes of gradients: the 2 more are blocks PyTorch's caching allocator holds without a live "
                  "tensor (the gradients stage_1_and_2.py frees before the step, the step's flat partitions in "
                  "segments of their own), counted by nvidia-smi and max_memory_reserved; the allocator releases such "
                  "segments and retries before it reports an OOM (c10 CUDACachingAllocator), so what must fit holds "
                  "only the live bytes (planner.memory.reported_bytes)",
           fitted_on="the 18-byte rule it splits (16-bit weights and gradients, fp32 master and Adam over the DP "
                     "ranks), chosen by the BigScience fp16 nvidia-smi peaks of tests/bench/memory_fit.py (seed 003's "
                     "1B3 on V100, tr11 and tr8 ZeRO-1; 54 peaks, mean error 5.0%); a + b/N bytes a parameter fitted "
                     "to tr11's 43 ZeRO-1 peaks alone gives 4.9 + 24/N, to seed 003's 21 alone 8.9 + 16/N "
                     "(tests/bench/NOTES.md, 2026-11-29 L511)",
           checked_on="tr11 L511 (TP8 PP6 DP8 MBS8: ran, nvidia-smi 75 GiB of 80) fits; seed 003's and tr11's OOM "
                      "rows stay out (tests/test_memory_published.py)"),
    Fitted(name="DEEPSPEED_PINNED_PARTITION_BYTES", value=8.0,
           unit="bytes a parameter over the DP ranks (x params / N), at most DEEPSPEED_FP16_RESERVED_BYTES",
           source="of the allocator's reserve beside DeepSpeed's fp16 ZeRO optimizer (DEEPSPEED_FP16_RESERVED_BYTES), "
                  "the part it cannot give back before an OOM (c10 CUDACachingAllocator frees cached segments and "
                  "retries a failed cudaMalloc; a segment a live tensor shares stays): the partition-sized segments "
                  "of runtime/zero/stage_1_and_2.py, between the step's flat 16-bit and fp32 partitions (2 + 4 "
                  "bytes a parameter over N, allocated after the backward, later split by activations) and every "
                  "partition-sized tensor it allocates (12/N: those, and at start-up the 16-bit clone and the fp32 "
                  "zero gradient of initialize_optimizer_states, 2 + 4)",
           fitted_on="the only published runs whose OOM-vs-ran outcome the reserve decides (tests/bench/validate.py, "
                     "memory_fit.py; every other fp16 DeepSpeed run keeps its verdict at any value): seed 003's PP2 "
                     "DP4 MBS16 on V100-32GB OOMed (needs > 6.85), tr8-104B's TP1 PP64 DP2 bnb OOMed (> 3.32), tr11 "
                     "L511 (TP8 PP6 DP8 MBS8) ran at nvidia-smi 75 GiB of 80 (< 9.71); 8 inside the range. The whole "
                     "reserve as must-fit (the 18-byte rule) rules L511 out; none of it misses the two OOMs; the "
                     "step's flat partitions alone (6) miss seed 003's",
           checked_on="three rows decide it: no held-out check (tests/bench/NOTES.md, 2026-11-29 L511)"),
    # -- tune (search.calibration) --
    Fitted(name="SIGMA_PRIOR", value=0.07, unit="sd of log(measured / planned step time)",
           source="prior residual spread of one configuration's prediction before probes say otherwise",
           fitted_on="median over the 17 replay tables of tests/bench/bench_search.py (seed 003, tr11, Hagemann) of "
                     "each table's spread after its own global scale (0.02-0.18)",
           checked_on="--sampler ei's choice does not depend on it (every candidate gets the same spread)"),
)

BY_NAME: dict[str, Fitted] = {f.name: f for f in TABLE}

GEMM_K_HALF = BY_NAME["GEMM_K_HALF"].value
DENSE_MISALIGNED_EFFICIENCY = BY_NAME["DENSE_MISALIGNED_EFFICIENCY"].value
ELEMENTWISE_BW_EFFICIENCY = BY_NAME["ELEMENTWISE_BW_EFFICIENCY"].value
SHARDED_OVERLAP = BY_NAME["SHARDED_OVERLAP"].value
RANKING_ERROR = BY_NAME["RANKING_ERROR"].value
LINK_EFFICIENCY = BY_NAME["LINK_EFFICIENCY"].value
HALF_BANDWIDTH_BYTES = {"intra": BY_NAME["HALF_BANDWIDTH_BYTES_INTRA"].value,
                        "inter": BY_NAME["HALF_BANDWIDTH_BYTES_INTER"].value}
COLLECTIVE_LATENCY_S = {"intra": BY_NAME["COLLECTIVE_LATENCY_S_INTRA"].value,
                        "inter": BY_NAME["COLLECTIVE_LATENCY_S_INTER"].value}
DS_MICROBATCH_OVERHEAD_S = BY_NAME["DS_MICROBATCH_OVERHEAD_S"].value
EAGER_HOST_S = BY_NAME["EAGER_HOST_S"].value
MEGATRON_HOST_S = BY_NAME["MEGATRON_HOST_S"].value
DS_DP_INTER_NODE_EFFICIENCY = BY_NAME["DS_DP_INTER_NODE_EFFICIENCY"].value
KERNEL_LAUNCH_S = BY_NAME["KERNEL_LAUNCH_S"].value
MOE_ROUTER_HOST_S = BY_NAME["MOE_ROUTER_HOST_S"].value
MEGATRON_CHUNK_HOST_S = BY_NAME["MEGATRON_CHUNK_HOST_S"].value
FLEX_LINK_EFFICIENCY = BY_NAME["FLEX_LINK_EFFICIENCY"].value
ASYNC_TP_HIDDEN = BY_NAME["ASYNC_TP_HIDDEN"].value
ROWWISE_GEMM_EFFICIENCY = BY_NAME["ROWWISE_GEMM_EFFICIENCY"].value
BLOCK_SCALED_GEMM_EFFICIENCY = BY_NAME["BLOCK_SCALED_GEMM_EFFICIENCY"].value
ALLOCATOR_OVERHEAD = BY_NAME["ALLOCATOR_OVERHEAD"].value
DEEPSPEED_FP16_RESERVED_BYTES = BY_NAME["DEEPSPEED_FP16_RESERVED_BYTES"].value
DEEPSPEED_PINNED_PARTITION_BYTES = BY_NAME["DEEPSPEED_PINNED_PARTITION_BYTES"].value
SIGMA_PRIOR = BY_NAME["SIGMA_PRIOR"].value



def markdown() -> str:
    """The table as the README shows it (tests/bench/fitted_constants.py): name, value, unit, what it was fitted on."""
    rows = ["| constant | value | unit | fitted on |", "|---|---|---|---|"]
    rows += [f"| `{f.name}` | {f.value:g} | {f.unit} | {f.fitted_on} |" for f in TABLE]
    return "\n".join(rows)


__all__ = ["BY_NAME", "TABLE", "Fitted", "markdown"]
