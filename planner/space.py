"""The search space's specs: `TrainingSpec` (what is fixed) and `Candidate` (one choice).

A ground-floor module: data and their checks only, no physics (enumeration is `planner.enumeration`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from planner import dualpipe, recompute_modes
from planner.errors import InputError
from planner.framework import OVERLAPS
from planner.model import Rampup
from planner.schema import did_you_mean

RECOMPUTE = recompute_modes.CLASSIC
"""the classic modes (tune's search space orders them by memory); every mode: `planner.recompute`"""
FRAMEWORKS = ("megatron-deepspeed", "megatron-lm", "fsdp")
"""the frameworks `plan` plans for and emits (--framework)"""
REPLAYED_FRAMEWORKS = ("deepspeed",)
"""frameworks a published run is costed as (search.published_runs), that `plan` neither offers nor emits:
DeepSpeed's engine on an eager Hugging Face model (planner.framework)"""
PRECISIONS = ("bf16", "fp16", "fp32", "fp8")
OPTIMIZERS = ("adamw", "adamw-bf16", "adamw-8bit", "sgd", "lion", "adafactor")
FSDP_STRATEGIES = {0: "NO_SHARD", 2: "SHARD_GRAD_OP", 3: "FULL_SHARD"}
FLAVORS = ("bigscience", "microsoft")
"""Megatron-DeepSpeed forks: bigscience-workshop/Megatron-DeepSpeed, microsoft (now deepspeedai)/Megatron-DeepSpeed"""
FSDP_TRAINERS = ("", "fms-fsdp", "hugging-face")
"""who runs a replayed fsdp run's model (TrainingSpec.fsdp_trainer): "" = torchtitan (plan's own)"""
PP_SCHEDULES_FSDP = ("1F1B", "GPipe", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", dualpipe.DUALPIPE_V)
"""torchtitan's pipeline_parallel_schedule values plan costs (planner.fsdp_parallel.SCHEDULES)"""
PP_SCHEDULES_MEGATRON = (dualpipe.DUALPIPE,)
"""schedules plan costs for Megatron-style runs besides Megatron-LM's own (1F1B, interleaved): DeepSeek's DualPipe
(planner.dualpipe), which Megatron-LM does not run (--emit refuses it, planner.rules.model_violations)"""
PP_SCHEDULES = PP_SCHEDULES_FSDP + PP_SCHEDULES_MEGATRON
"""every --pp-schedule value"""
CUDA_GRAPH_SCOPES = ("layer", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "full_iteration")
"""what --cuda-graphs takes: Megatron's CudaGraphScope values (megatron/core/transformer/enums.py) and "layer", the
whole transformer layer (Megatron: --cuda-graph-impl transformer_engine with no --cuda-graph-scope); what each
captures and costs: planner.cuda_graphs"""
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")
"""Megatron-LM's --offload-modules (megatron/core/transformer/transformer_config.py offload_modules: the modules whose
input --fine-grained-activation-offloading copies to the host in the forward and back for the backward); what each
costs: planner.offload"""
PINNABLE = ("tp", "pp", "dp", "mbs", "gas", "vpp")
"""degrees a user may pin (--tp 8 --pp 4 ...), like --gpus"""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSpec:
    """What the user fixes: batch, sequence, precision, optimizer, framework, rampup, memory rule."""

    global_batch: int
    seq_len: int
    precision: str = "bf16"
    optimizer: str = "adamw"
    framework: str = "megatron-deepspeed"
    flavor: str = "bigscience"
    """Megatron-DeepSpeed fork (bigscience | microsoft); ignored by the other frameworks"""
    rampup: Rampup | None = None
    memory_fraction: float = 0.75
    """seed 004's first guess: model states (weights, grads, optimizer) above this fraction of GPU memory
    are marked in the table (advisory; only the predicted total against memory minus headroom prunes)"""
    memory_headroom: float = 0.05
    """fraction of GPU memory kept free of the predicted total (allocator spikes, NCCL buffers)"""
    flash_attention: bool = True
    """attention without the s^2 score matrix in memory (FlashAttention; not in the BigScience fork)"""
    attention_kernel: str = ""
    """the attention core's kernel (planner.attention.KERNELS: fa1 | fa2 | fa3 | cudnn | fused-softmax | unfused);
    "": what the framework runs on the GPU (planner.attention.default_kernel)"""
    train_tokens: float | None = None
    max_mbs: int = 16
    recompute_options: tuple[str, ...] = RECOMPUTE
    """which recompute modes to enumerate (--recompute none,full)"""
    zero_options: tuple[int, ...] = (0, 1, 2, 3)
    """which ZeRO stages / FSDP strategies to enumerate (--zero 0,1)"""
    pins: tuple[tuple[str, int], ...] = ()
    """degrees the user fixed, sorted (name, value) pairs of PINNABLE (--tp 8 --pp 4)"""
    cp_options: tuple[int, ...] | None = None
    """context-parallel sizes to enumerate (--cp 1,2,4); None = planner.context_parallel.cp_choices"""
    ep_options: tuple[int, ...] | None = None
    """expert-parallel sizes to enumerate (--ep 1,8); None = the divisors of the expert count"""
    moe_capacity_factor: float | None = None
    """MoE expert capacity factor (--moe-expert-capacity-factor); None = dropless"""
    moe_dispatcher: str = "alltoall"
    """Megatron-LM's MoE token dispatcher (planner.moe.DISPATCHERS): alltoall | allgather | deepep | hybridep (the
    last two: --moe-token-dispatcher-type flex with that --moe-flex-dispatcher-backend)"""
    fp8_recipe: str = "delayed"
    """Transformer Engine FP8 scaling under --precision fp8 (Megatron-LM --fp8-recipe): delayed | tensorwise"""
    fp8_activations: str = "te"
    """what an FP8 run keeps for the backward and sends to the experts (`planner.fp8.ACTIVATION_RECIPES`): "te",
    Transformer Engine's FP8 copies of the GEMM inputs beside the 16-bit tensors the other ops keep, the expert
    dispatch in 16 bits; "deepseek", DeepSeek-V3's (report Sec. 3.3.3): every Linear's input cached only in FP8, the
    attention output in E5M6, the SwiGLU input in FP8 with its output recomputed, the dispatch in FP8
    (--fp8-activations)"""
    optimizer_state_dtype: str = "fp32"
    """Adam's moments: fp32 | bf16 (DeepSeek-V3 report Sec. 3.3.3; Megatron-LM --use-precision-aware-optimizer
    --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16; --optimizer-state-dtype)"""
    grad_reduce_dtype: str = "fp32"
    """Megatron-LM's main grads under bf16: fp32 (its default) | bf16 (--grad-reduce-in-bf16)"""
    flops_attention: str = "full"
    """how model / hardware FLOPs (TFLOPs, MFU) count attention's s^2 work: full | causal (planner.flops)"""
    overlap: tuple[str, ...] | None = None
    """Megatron-LM communication overlapped with compute (planner.framework.OVERLAPS: grad-reduce, param-gather,
    tp-comm, p2p); None = the framework's default (Megatron-LM: grad-reduce, param-gather, p2p; --overlap)"""
    pp_schedule: str = ""
    """the pipeline schedule: torchtitan's (planner.fsdp_parallel.SCHEDULES, --framework fsdp) or DeepSeek's DualPipe
    (planner.dualpipe, --framework megatron-lm); empty: 1F1B, Interleaved1F1B when VPP > 1"""
    torch_compile: bool = False
    """torchtitan [compile] enable: Inductor fuses the element-wise chains (planner.fsdp_parallel.runtime_framework)"""
    async_tp: bool = False
    """torchtitan's async tensor parallel (needs torch_compile): planner.fsdp_parallel.tp_exposed_fraction"""
    activation_offload: tuple[str, ...] = ()
    """Megatron-LM's --fine-grained-activation-offloading --offload-modules (planner.offload.ACTIVATION_MODULES):
    the modules whose inputs go to the host between forward and backward; () = none"""
    cuda_graphs: tuple[str, ...] = ()
    """Megatron-LM's CUDA-graph scopes (planner.cuda_graphs.SCOPES: layer | attn | mlp | moe | moe_router |
    moe_preprocess | full_iteration; --cuda-graph-impl / --cuda-graph-scope): their host launches replayed as one
    graph; () = eager"""
    optimizer_offload: float = 0.0
    """fraction of the optimizer states Megatron-LM keeps on the host (--optimizer-cpu-offload
    --optimizer-offload-fraction; `planner.offload`); 0: none"""
    offload_search: bool = True
    """whether plan searches activation and CPU optimizer offload on Megatron-LM MoE layouts memory rules out
    (`planner.offload.searched_sets`, `optimizer_searched`); False: --no-offload-search"""
    eager_ops: bool = False
    """the element-wise ops run as PyTorch ops, one kernel each (planner.ops.eager_elementwise_bytes), under a
    framework that would fuse them: a trainer outside plantune's emitters (Hagemann et al.'s Megatron-style one);
    the norms follow ``fused_norm``. Eager frameworks (fsdp without torch.compile) are eager whatever it says"""
    fsdp_trainer: str = ""
    """who runs the fsdp framework's model, for runs replayed from their sources (`FSDP_TRAINERS`): "" = torchtitan,
    what plan emits (FSDP2's per-parameter all-gather copied out, the cross-entropy on fp32 logits: planner.cost);
    "fms-fsdp" (FSDP1 gathers into its flat parameter in place, the loss on the 16-bit logits); "hugging-face"
    (transformers' Trainer, 16-bit logits into the loss)"""
    fused_norm: bool = True
    """the norms run as one fused kernel (apex / Transformer Engine / Inductor, and every config plantune emits);
    False: PyTorch's reference RMSNorm as separate ops (--unfused-norm; Hagemann et al.'s runs without their "RMS
    kernel"), more activation memory (planner.memory.layer_activations) and HBM traffic (planner.cost)"""

    def __post_init__(self) -> None:
        if self.global_batch <= 0:
            raise InputError(f"--global-batch must be > 0, got {self.global_batch}")
        if self.seq_len <= 0:
            raise InputError(f"--seq-len must be > 0, got {self.seq_len}")
        if self.precision not in PRECISIONS:
            raise InputError(f"unknown precision {self.precision!r}; use one of {', '.join(PRECISIONS)}")
        if self.optimizer not in OPTIMIZERS:
            raise InputError(f"unknown optimizer {self.optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
        if self.framework not in FRAMEWORKS + REPLAYED_FRAMEWORKS:
            raise InputError(f"unknown framework {self.framework!r}; use one of {', '.join(FRAMEWORKS)}")
        if not 0 < self.memory_fraction <= 1:
            raise InputError(f"--memory-fraction must be in (0, 1], got {self.memory_fraction}")
        if not 0 <= self.memory_headroom < 1:
            raise InputError(f"--memory-headroom must be in [0, 1), got {self.memory_headroom}")
        if self.fsdp_trainer not in FSDP_TRAINERS:
            raise InputError(f"unknown fsdp trainer {self.fsdp_trainer!r}; use one of "
                             f"{', '.join(repr(t) for t in FSDP_TRAINERS)}")
        if self.flavor not in FLAVORS:
            raise InputError(f"unknown Megatron-DeepSpeed flavor {self.flavor!r}; use one of {', '.join(FLAVORS)}")
        bad_pins = [f"{k}={v}" for k, v in self.pins if k not in PINNABLE or not isinstance(v, int) or v < 1]
        if bad_pins:
            raise InputError(f"pins {', '.join(bad_pins)}: pin {', '.join(PINNABLE)} to positive integers")
        if self.max_mbs <= 0:
            raise InputError(f"--max-mbs must be > 0, got {self.max_mbs}")
        bad = [r for r in self.recompute_options if not recompute_modes.is_valid(r, search=True)]
        if bad or not self.recompute_options:
            raise InputError(f"--recompute: {bad or 'empty'}; choose from {', '.join(recompute_modes.OPTIONS)} "
                             "(block-N, uniform-N and selective-layer-N fix N)")
        if not self.zero_options or any(z not in (0, 1, 2, 3) for z in self.zero_options):
            raise InputError(f"--zero: {list(self.zero_options)}; choose stages from 0, 1, 2, 3")
        if self.flops_attention not in ("full", "causal"):
            raise InputError(f"--flops-attention {self.flops_attention!r}: use full or causal")
        if self.overlap is not None:
            bad = [o for o in self.overlap if o not in OVERLAPS]
            if bad:
                raise InputError(f"unknown overlap {', '.join(bad)}; use some of {', '.join(OVERLAPS)} (or none)")
            if self.overlap and self.framework != "megatron-lm":
                raise InputError(f"--overlap {','.join(self.overlap)} is Megatron-LM's; the framework here is "
                                 f"{self.framework}: add --framework megatron-lm or drop --overlap")
            if "param-gather" in self.overlap and "grad-reduce" not in self.overlap:
                raise InputError("--overlap param-gather needs grad-reduce too (Megatron-LM arguments.py: 'Must use "
                                 "--overlap-param-gather with --overlap-grad-reduce'); add grad-reduce")
        bad = offload_problem(self.activation_offload, "--activation-offload")
        if bad:
            raise InputError(bad)
        if self.activation_offload and self.framework != "megatron-lm":
            raise InputError("--activation-offload is Megatron-LM's (--fine-grained-activation-offloading); the "
                             f"framework here is {self.framework}: add --framework megatron-lm or drop it")
        bad_graphs = cuda_graphs_problem(self.cuda_graphs, self.framework)
        if bad_graphs:
            raise InputError(bad_graphs)
        if not 0 <= self.optimizer_offload <= 1:
            raise InputError(f"--optimizer-offload must be a fraction in [0, 1], got {self.optimizer_offload}")
        if self.optimizer_offload and self.framework != "megatron-lm":
            raise InputError("--optimizer-offload is Megatron-LM's (--optimizer-cpu-offload); the framework here is "
                             f"{self.framework}: add --framework megatron-lm or drop --optimizer-offload")
        if self.grad_reduce_dtype not in ("fp32", "bf16"):
            raise InputError(f"unknown gradient reduce dtype {self.grad_reduce_dtype!r}; use fp32 or bf16")
        if self.fp8_recipe not in ("delayed", "tensorwise", "rowwise", "mxfp8", "blockwise"):   # fp8.FP8_RECIPES
            raise InputError(f"unknown FP8 recipe {self.fp8_recipe!r}; use delayed, tensorwise, rowwise, mxfp8 or "
                             "blockwise")
        if self.fp8_activations not in ("te", "deepseek"):   # fp8.ACTIVATION_RECIPES
            raise InputError(f"unknown FP8 activation recipe {self.fp8_activations!r}; use te or deepseek")
        if self.fp8_activations != "te" and self.precision != "fp8":
            raise InputError(f"--fp8-activations {self.fp8_activations} is an FP8 recipe; add --precision fp8 or drop "
                             "it")
        if self.fp8_activations == "deepseek" and self.precision == "fp8" and self.fp8_recipe != "blockwise":
            raise InputError("--fp8-activations deepseek caches in DeepSeek-V3's 1x128 tiles (report Sec. 3.3.1-3.3.3); "
                             f"the scaling here is {self.fp8_recipe}: add --fp8-recipe blockwise")
        if self.fp8_activations == "deepseek" and self.framework != "megatron-lm":
            raise InputError("--fp8-activations deepseek is DeepSeek-V3's own framework's (report Sec. 3.3.3), planned "
                             f"for Megatron-style runs (--framework megatron-lm); the framework here is {self.framework}: "
                             "add --framework megatron-lm or drop it")
        if self.optimizer_state_dtype not in ("fp32", "bf16"):
            raise InputError(f"unknown optimizer state dtype {self.optimizer_state_dtype!r}; use fp32 or bf16")
        if self.optimizer_state_dtype != "fp32" and self.optimizer != "adamw":
            raise InputError(f"--optimizer-state-dtype {self.optimizer_state_dtype} sets Adam's moments (Megatron-LM "
                             f"--exp-avg-dtype / --exp-avg-sq-dtype); the optimizer here is {self.optimizer}: use "
                             "--optimizer adamw or drop it")
        if self.optimizer_state_dtype != "fp32" and self.framework != "megatron-lm":
            raise InputError(f"--optimizer-state-dtype {self.optimizer_state_dtype} is Megatron-LM's precision-aware "
                             f"optimizer (--use-precision-aware-optimizer --exp-avg-dtype); the framework here is "
                             f"{self.framework}: add --framework megatron-lm or drop it")
        if self.optimizer_state_dtype != "fp32" and self.optimizer_offload:
            raise InputError(offload_moments_conflict(self.optimizer_state_dtype) + ": drop --optimizer-offload or "
                             "--optimizer-state-dtype")
        if self.pp_schedule and self.pp_schedule not in PP_SCHEDULES:
            raise InputError(f"unknown pipeline schedule {self.pp_schedule!r}; use one of "
                             f"{', '.join(PP_SCHEDULES)}")
        if self.pp_schedule in PP_SCHEDULES_MEGATRON and self.framework != "megatron-lm":
            raise InputError(f"--pp-schedule {self.pp_schedule} is DeepSeek's schedule, planned for Megatron-style runs "
                             f"(--framework megatron-lm); the framework here is {self.framework}: add --framework "
                             "megatron-lm, or use --pp-schedule DualPipeV with --framework fsdp (torchtitan)")
        if ((self.pp_schedule and self.pp_schedule not in PP_SCHEDULES_MEGATRON) or self.torch_compile
                or self.async_tp) and self.framework != "fsdp":
            raise InputError("--pp-schedule, --torch-compile and --async-tp are torchtitan's (--framework fsdp); "
                             f"the framework here is {self.framework}: add --framework fsdp or drop them")
        if self.fp8_recipe == "rowwise" and self.framework != "fsdp":
            raise InputError("--fp8-recipe rowwise is torchao's (torchtitan float8, --framework fsdp); Transformer "
                             "Engine plans delayed, tensorwise, mxfp8 or blockwise")
        if self.fp8_recipe == "blockwise" and self.framework != "megatron-lm":
            raise InputError("--fp8-recipe blockwise is Transformer Engine's Float8BlockScaling (Megatron-LM "
                             "--fp8-recipe blockwise); add --framework megatron-lm, or use mxfp8, tensorwise or "
                             "rowwise")
        if self.async_tp and not self.torch_compile:
            raise InputError("--async-tp needs --torch-compile (torchtitan: async TP is a torch.compile pass)")
        if self.moe_dispatcher not in ("alltoall", "allgather", "deepep", "hybridep"):   # planner.moe.DISPATCHERS
            raise InputError(f"unknown MoE dispatcher {self.moe_dispatcher!r}; use alltoall, allgather, deepep or "
                             "hybridep")
        if self.moe_dispatcher != "alltoall" and self.framework != "megatron-lm":
            raise InputError(f"--moe-dispatcher {self.moe_dispatcher} is Megatron-LM's (--moe-token-dispatcher-type); "
                             f"the framework here is {self.framework}: add --framework megatron-lm or drop it")
        if self.moe_capacity_factor is not None and not self.moe_capacity_factor >= 1:
            raise InputError(f"--moe-capacity-factor must be >= 1, got {self.moe_capacity_factor}")
        if any(not isinstance(v, int) or v < 1 for v in (self.cp_options or ()) + (self.ep_options or ())):
            raise InputError(f"--cp / --ep: sizes must be positive integers, got {self.cp_options} {self.ep_options}")
        if self.rampup is not None and self.rampup.start >= self.global_batch:
            raise InputError(f"rampup start {self.rampup.start} must be below the global batch "
                             f"{self.global_batch} (megatron/microbatches.py)")

    @property
    def deepseek_fp8_storage(self) -> bool:
        """Whether the run caches and dispatches as DeepSeek-V3 did (--fp8-activations deepseek, which
        `__post_init__` allows under --precision fp8 only): `planner.fp8.deepseek_layer_bytes`, the FP8 dispatch
        (`planner.moe.all_to_all_layer_s`)."""
        return self.fp8_activations == "deepseek"


def offload_problem(modules: tuple[str, ...], what: str) -> str | None:
    """Why Megatron-LM refuses an --offload-modules list (one line with a fix), or None (transformer_config.py)."""
    bad = [m for m in modules if m not in OFFLOAD_MODULES]
    if bad:
        return f"{what}: unknown offload module {', '.join(bad)}; use some of {', '.join(OFFLOAD_MODULES)}"
    if "attn_proj" in modules and "core_attn" not in modules:
        return (f"{what}: attn_proj needs core_attn too (transformer_config.py: 'attn_proj cannot be set to "
                "offload_modules alone without core_attn'); add core_attn")
    return None


def offload_moments_conflict(state_dtype: str) -> str:
    """Why a CPU optimizer offload and 16-bit Adam moments do not go together: Megatron-LM builds the
    HybridDeviceOptimizer without the moments' dtype (megatron/core/optimizer/__init__.py: its optimizer_defaults carry
    lr, betas, eps, no exp_avg_dtype; optimizer_config.py returns before TE's precision-aware check under
    optimizer_cpu_offload), so its CPU AdamW and GPU FusedAdam keep fp32 moments of fp32 copies, on the host and on the
    GPU, whatever --exp-avg-dtype says: the plan's bf16 moments would not be what runs."""
    return (f"CPU optimizer offload with --optimizer-state-dtype {state_dtype}: Megatron-LM's HybridDeviceOptimizer "
            "keeps fp32 Adam moments (optimizer/__init__.py passes it no --exp-avg-dtype)")


def cuda_graphs_problem(scopes: tuple[str, ...], framework: str) -> str | None:
    """Why TrainingSpec refuses the scopes (one line with a fix), or None: the checks that need no model."""
    bad = [s for s in scopes if s not in CUDA_GRAPH_SCOPES]
    if bad:
        return f"unknown CUDA graph scope {', '.join(bad)}; use some of {', '.join(CUDA_GRAPH_SCOPES)}"
    if scopes and framework != "megatron-lm":
        return (f"--cuda-graphs is Megatron-LM's (--cuda-graph-impl / --cuda-graph-scope); the framework here is "
                f"{framework}: add --framework megatron-lm or drop it")
    if ("full_iteration" in scopes or "layer" in scopes) and len(scopes) > 1:
        return ("--cuda-graphs full_iteration and layer stand alone (arguments.py: full_iteration only with "
                "--cuda-graph-impl local; the whole layer is the empty scope list); keep one")
    if "moe" in scopes and "moe_router" in scopes:
        return "--cuda-graphs moe and moe_router exclude each other (transformer_config.py: 'cuda_graph_scope must " \
               "not contain both moe and moe_router'); keep one"
    if "moe_preprocess" in scopes and "moe_router" not in scopes:
        return ("--cuda-graphs moe_preprocess needs moe_router (transformer_config.py: 'moe_preprocess cuda graph is "
                "only supported with moe_router cuda graph'); add moe_router")
    return None


@dataclass(frozen=True, slots=True)
class Dimension:
    """One dimension of a layout (a `Candidate` field): what enumeration, the label, --explain, the JSON row, tune's
    search space and the rulebook's size check read, from `DIMENSIONS`."""

    name: str
    kind: type
    """int, bool, str or float"""
    default: object = None
    """None: every layout states it (the label always shows it); else the label shows it only when it differs"""
    searched: bool = True
    """a parameter of tune's study (DP and GAS follow from the others)"""
    log2: bool = False
    """a size compared on a log2 scale (tune's nearest-survivor distance)"""


DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("tp", int, log2=True), Dimension("pp", int, log2=True), Dimension("dp", int, searched=False),
    Dimension("mbs", int, log2=True), Dimension("gas", int, searched=False), Dimension("recompute", str),
    Dimension("zero", int), Dimension("sp", bool, False), Dimension("vpp", int, 1, log2=True),
    Dimension("hybrid", bool, False), Dimension("cp", int, 1, log2=True), Dimension("ep", int, 1, log2=True),
    Dimension("etp", int, 1, log2=True), Dimension("offload", str, ""), Dimension("opt_offload", float, 0.0),
)
"""the one table of a layout's dimensions, in `Candidate`'s field order (tests/test_dimensions.py checks both)"""
SIZES = tuple(d.name for d in DIMENSIONS if d.kind is int and d.name != "zero")
"""the dimensions that are sizes (>= 1)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One parallel layout. DP is derived by the caller as world / (TP·PP)."""

    tp: int
    pp: int
    dp: int
    mbs: int
    gas: int
    recompute: str = "none"
    """`planner.recompute` mode: none | selective | full | block-N | uniform-N | selective-op | selective-layer-N"""
    zero: int = 0
    """ZeRO stage 0-3; for FSDP: 0 NO_SHARD, 2 SHARD_GRAD_OP, 3 FULL_SHARD (HYBRID_SHARD with hybrid)"""
    sp: bool = False
    """Megatron sequence parallelism (needs TP > 1)"""
    vpp: int = 1
    """virtual pipeline stages per GPU (interleaved 1F1B); 1 = plain 1F1B"""
    hybrid: bool = False
    """FSDP HYBRID_SHARD: shard inside a node, replicate across nodes"""
    cp: int = 1
    """context parallel: each sequence split over CP ranks (world = TP·CP·PP·DP)"""
    ep: int = 1
    """expert parallel: experts spread over EP ranks of the TP·CP·DP grid"""
    etp: int = 1
    """expert tensor parallel: each expert's FFN split over ETP ranks"""
    offload: str = ""
    """Megatron-LM's fine-grained activation offload chosen for this layout, its modules joined by "+"
    (OFFLOAD_MODULES; `planner.offload.modules_of`); "": none, or the training's --activation-offload"""
    opt_offload: float = 0.0
    """Megatron-LM's CPU optimizer offload chosen for this layout: the fraction of the GPU's optimizer shard (fp32
    master weights and Adam moments) on the host (--optimizer-offload-fraction; `planner.offload.optimizer_fraction`);
    0: none, or the training's --optimizer-offload"""

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def global_batch(self) -> int:
        return self.mbs * self.dp * self.gas

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp

    @property
    def fsdp_strategy(self) -> str:
        return "HYBRID_SHARD" if self.hybrid else FSDP_STRATEGIES.get(self.zero, f"ZERO{self.zero}")

    def label(self) -> str:
        """``tp=4,pp=12,dp=8,mbs=2,gas=128,recompute=full,zero=1[,sp=1,vpp=2,...]``: every dimension without a default,
        the others where they differ from it (`DIMENSIONS`)."""
        parts = []
        for d in DIMENSIONS:
            value = getattr(self, d.name)
            if d.default is None or value != d.default:
                parts.append(f"{d.name}={int(value) if d.kind is bool else f'{value:g}' if d.kind is float else value}")
        return ",".join(parts)

    def to_dict(self) -> dict:
        return asdict(self)


def _candidate_builder():
    """`candidate_of`: each field stored through its slot's descriptor, as the frozen dataclass's ``__init__`` stores
    it through ``object.__setattr__`` (same object: tests/test_plan_memory.py), in half the time; `plan` builds a
    hundred thousand candidates (row heads, the layouts memory tries)."""
    assert "__post_init__" not in Candidate.__dict__, "candidate_of would skip Candidate.__post_init__"
    new = object.__new__
    (tp_, pp_, dp_, mbs_, gas_, recompute_, zero_, sp_, vpp_, hybrid_, cp_, ep_, etp_, offload_,
     opt_offload_) = (getattr(Candidate, name).__set__ for name in Candidate.__slots__)

    def candidate_of(tp: int, pp: int, dp: int, mbs: int, gas: int, recompute: str, zero: int, sp: bool, vpp: int,
                     hybrid: bool, cp: int, ep: int, etp: int, offload: str = "", opt_offload: float = 0.0,
                     ) -> Candidate:
        """``Candidate(tp=tp, ..., opt_offload=opt_offload)``, every field given in `Candidate`'s order."""
        c = new(Candidate)
        tp_(c, tp), pp_(c, pp), dp_(c, dp), mbs_(c, mbs), gas_(c, gas), recompute_(c, recompute), zero_(c, zero)
        sp_(c, sp), vpp_(c, vpp), hybrid_(c, hybrid), cp_(c, cp), ep_(c, ep), etp_(c, etp), offload_(c, offload)
        opt_offload_(c, opt_offload)
        return c
    return candidate_of


assert Candidate.__slots__ == ("tp", "pp", "dp", "mbs", "gas", "recompute", "zero", "sp", "vpp", "hybrid", "cp", "ep",
                               "etp", "offload", "opt_offload"), "candidate_of sets every Candidate field in order"
candidate_of = _candidate_builder()


def candidate_with(c: Candidate, *, recompute: str | None = None, ep: int | None = None, etp: int | None = None,
                   offload: str | None = None, opt_offload: float | None = None) -> Candidate:
    """``replace(c, ...)`` of the fields given (None: ``c``'s), built by `candidate_of` (several times faster than
    `dataclasses.replace`, which plan()'s memory searches and rules would call per mode, EP and offload tried)."""
    return candidate_of(c.tp, c.pp, c.dp, c.mbs, c.gas, c.recompute if recompute is None else recompute, c.zero, c.sp,
                        c.vpp, c.hybrid, c.cp, c.ep if ep is None else ep, c.etp if etp is None else etp,
                        c.offload if offload is None else offload,
                        c.opt_offload if opt_offload is None else opt_offload)


def divisors(n: int) -> list[int]:
    """Divisors of n in increasing order, in O(sqrt n)."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


MAX_VPP = 10_000
"""--explain's largest vpp: the schema's largest layer count (planner.schema MODEL layers), one layer a chunk"""


def parse_explain(text: str, *, world: int, global_batch: int) -> Candidate:
    """``"tp=4,pp=12,mbs=2,recompute=full,zero=1"`` -> Candidate; dp and gas are derived when absent."""
    fields: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise InputError(f"--explain: {part!r} is not key=value; e.g. \"tp=4,pp=12,mbs=2,recompute=full,zero=1\"")
        k, v = (s.strip().lower() for s in part.split("=", 1))
        if k in fields:    # tp=4,tp=8: which one was meant is not ours to guess (as a key given twice in a file)
            raise InputError(f"--explain: {k} is given twice ({k}={fields[k][:24]} and {k}={v[:24]}); keep one")
        fields[k] = v
    known = {d.name for d in DIMENSIONS}
    if set(fields) - known:
        unknown = sorted(set(fields) - known)
        named = ", ".join(f"{k[:24]!r}{did_you_mean(k, sorted(known))}" for k in unknown[:3])
        raise InputError(f"--explain: unknown key{'s' if len(unknown) > 1 else ''} {named}"
                         f"{', ...' if len(unknown) > 3 else ''}; known: {', '.join(sorted(known))}")

    # A value outside what the key can ever hold is an input error, not a layout "RULED OUT": a degree above the
    # cluster's GPU count, a micro-batch or GAS above the global batch, a ZeRO stage other than 0-3.
    most = {"tp": (world, f"the {world:,} GPUs"), "pp": (world, f"the {world:,} GPUs"),
            "dp": (world, f"the {world:,} GPUs"), "cp": (world, f"the {world:,} GPUs"),
            "ep": (world, f"the {world:,} GPUs"), "etp": (world, f"the {world:,} GPUs"),
            "mbs": (global_batch, f"the global batch {global_batch:,}"),
            "gas": (global_batch, f"the global batch {global_batch:,}"),
            "vpp": (MAX_VPP, f"{MAX_VPP:,} model chunks per stage (one layer each in a 10,000-layer model)"),
            "zero": (3, "")}

    def num(key: str, default: int) -> int:
        raw = fields.get(key)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:     # also past Python's 4,300 digits: still a number, just too large
            if not raw.isdigit():
                raise InputError(f"--explain: {key}={raw[:24]} is not an integer") from None
            value = most[key][0] + 1
        if value < 0 or (value == 0 and key not in ("zero", "sp", "hybrid")):
            raise InputError(f"--explain: {key}={raw} must be positive")
        top, what = most[key]
        if key == "zero" and value > top:
            raise InputError(f"--explain: zero={raw[:24]} is not a ZeRO stage (or FSDP strategy); give zero=0, 1, 2 or 3")
        if value > top:
            shown = raw if len(raw) <= 24 else raw[:12] + "..." + raw[-4:]
            raise InputError(f"--explain: {key}={shown} is more than {what}; give {key} <= {top:,}")
        return value
    tp, pp, mbs, cp = num("tp", 1), num("pp", 1), num("mbs", 1), num("cp", 1)
    dp = num("dp", max(world // (tp * pp * cp), 1))
    gas = num("gas", max(global_batch // (mbs * dp), 1))
    recompute = fields.get("recompute", "none")
    if not recompute_modes.is_valid(recompute):
        raise InputError(f"--explain: recompute={recompute} must be one of {', '.join(recompute_modes.CLASSIC)}, "
                         "block-N, uniform-N (Megatron --recompute-method, N layers per model chunk), selective-op "
                         "or selective-layer-N (torchtitan)")
    offloaded = fields.get("offload", "")
    bad = offload_problem(tuple(m for m in offloaded.split("+") if m), f"--explain offload={offloaded}")
    if bad:
        raise InputError(bad)
    try:
        opt_offload = float(fields.get("opt_offload", "0"))
    except ValueError:
        raise InputError(f"--explain: opt_offload={fields['opt_offload'][:24]} is not a number; give a fraction in "
                         "[0, 1]") from None
    if not 0 <= opt_offload <= 1:
        raise InputError(f"--explain: opt_offload={fields['opt_offload'][:24]} must be a fraction in [0, 1] (Megatron "
                         "--optimizer-offload-fraction)")
    truthy, falsy = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
    for key in ("sp", "hybrid"):
        if fields.get(key, "0") not in truthy | falsy:
            raise InputError(f"--explain: {key}={fields[key]} must be 1 or 0 (true or false)")
    return Candidate(tp=tp, pp=pp, dp=dp, mbs=mbs, gas=gas, recompute=recompute, zero=num("zero", 0),
                     sp=fields.get("sp", "0") in truthy, vpp=num("vpp", 1), hybrid=fields.get("hybrid", "0") in truthy,
                     cp=cp, ep=num("ep", 1), etp=num("etp", 1), offload=offloaded,
                     opt_offload=opt_offload)
