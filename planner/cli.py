"""`plan`: rank every parallel layout of a model on a cluster, or explain one.

    plan --model 176B --gpus 384
    plan --model 1B3 --cluster examples/cluster-2x4-v100-16gb.yaml --precision fp16 --recompute full
    plan --model 176B --gpus 384 --explain "tp=4,pp=12,mbs=2,recompute=full,zero=1" --format json
    plan --model 176B --gpus 384 --emit megatron-deepspeed --out run/
    plan --from run/plan.yaml --explain
    plan --model llama3-405b --gpus 2048 --gpu H100-SXM --tp 8 --pp 16 --emit megatron-lm

Every layout is judged by `planner.rules` for the target it will run on: the framework (default per
model: the BigScience fork where it can express the model, else Megatron-LM; the output says which),
the fork flavour (--emit-flavor) and, with --emit, the emitter's kind.

Bad input prints one line and exits 2; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from planner import attention, cuda_graphs, dualpipe, flops, fp8, moe, recompute as recompute_modes
from planner.cost import RANKING_ERROR, attention_kernel, tied
from planner.errors import InputError, PlantuneError
from planner.calibration import apply_calibration, compute_line
from planner.files import check_out
from planner.framework import TORCHTITAN_VERSIONS
from planner.hardware import ClusterSpec, load_cluster, make_cluster
from planner.model import HF_SEQ_NOTE, ModelSpec, Rampup, at_seq_len, load_model, positions_note
from planner.rampup_schedule import rampup_schedule
from planner.rank import Estimate, Plan, estimate, plan
from planner.rules import Target, model_violations
from planner.schema import check_flags, check_training, did_you_mean
from planner.table import simple_table
from planner.space import (FRAMEWORKS, OPTIMIZERS, PINNABLE, PP_SCHEDULES, PRECISIONS, RECOMPUTE, TrainingSpec,
                           parse_explain)

FORMATS = ("table", "json", "yaml", "csv")
TABLE_COLUMNS = ("rank", "tp", "pp", "dp", "mbs", "gas", "recompute", "zero", "sp", "vpp", "memory_gb_per_gpu",
                 "headroom", "step_time_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "tokens_per_s", "note")


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit status 2 (shared by `plan` and `tune`)."""

    def _get_formatter(self) -> argparse.HelpFormatter:
        """argparse's formatter, with the terminal's width (as HelpFormatter reads it) read once per parser:
        add_argument builds a formatter on every call only to check the metavar, and reading the width each time was
        most of the formatter's cost (~60 of them for `plan`'s parser)."""
        width = self.__dict__.get("_terminal_width")
        if width is None:
            import shutil   # where HelpFormatter imports it: when a formatter is first built

            width = self._terminal_width = shutil.get_terminal_size().columns - 2
        return self.formatter_class(prog=self.prog, width=width)

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("unrecognized arguments: ") and "did you mean" not in message:   # the nearest flag
            flag = message.removeprefix("unrecognized arguments: ").split()[0].split("=")[0]
            if flag.startswith("--"):
                message += did_you_mean(flag, [o for o in self._option_string_actions if o.startswith("--")])
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def _get_option_tuples(self, option_string: str):  # type: ignore[override]
        """A prefix matching several spellings of one option (--global: --global-batch and --global_batch) is that
        option, not ambiguous; a prefix of two different options stays ambiguous."""
        tuples = super()._get_option_tuples(option_string)
        unique: dict[int, tuple] = {}
        for t in tuples:
            unique.setdefault(id(t[0]), t)
        return list(unique.values())

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """argparse's parse_args, whose refusal of unknown flags names the closest known one."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._did_you_mean(extras)}")
        return parsed

    def _did_you_mean(self, extras: list[str]) -> str:
        import difflib

        known = sorted({s for a in self._actions for s in a.option_strings if s.startswith("--")})
        hints = []
        for flag in (e.split("=", 1)[0] for e in extras if e.startswith("--")):
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
            if close:
                hints.append(f"{flag}: did you mean {close[0]}?")
        return "; " + "; ".join(hints) if hints else ""


def number(kind: type, *, allow_zero: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: a positive (or, with ``allow_zero``, non-negative) int or float."""
    noun = "an integer" if kind is int else "a number"

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if value < 0 or (value == 0 and not allow_zero):
            raise argparse.ArgumentTypeError(f"{value} must be {'>= 0' if allow_zero else '> 0'}")
        return value
    return parse


_positive_int = number(int)
_positive_float = number(float)


def add_setup_arguments(p: argparse.ArgumentParser, *, model_required: bool = True) -> None:
    """The model / cluster / training flags shared by `plan` and `tune` (both spellings: --a-b and --a_b)."""
    def add(*names: str, **kw: object) -> None:
        spellings = list(names) + ["--" + n[2:].replace("-", "_") for n in names if "-" in n[2:]]
        p.add_argument(*spellings, **kw)  # type: ignore[arg-type]

    add("--model", required=model_required, help="preset or size shorthand (176B, 1B3, 175B, 530B, 1T, llama3-405b, "
                                                  "...), a HF config.json, or a plantune model YAML")
    add("--gpus", type=_positive_int, help="total GPUs (a multiple of --gpus-per-node)")
    add("--nodes", type=_positive_int, help="nodes, instead of --gpus")
    add("--gpu", default=None, help="accelerator: a catalog id (default A100-80GB; planner/accelerators.yaml: V100, "
                                    "A100, H100-SXM/PCIe/NVL, H800, H20, GH200, H200, B200, GB200, L4, L40S, A10, "
                                    "MI250X, MI300X, MI325X, ...) or a GPU YAML describing yours")
    add("--gpus-per-node", type=_positive_int, default=None,
        help="GPUs per node (default: the accelerator's usual node, 8 for most); fewer --gpus plan one partial node")
    add("--cluster", help="cluster YAML (gpu, gpus_per_node, nodes, inter_node_gbps or nics_per_node x nic_gbps, "
                          "intra_node_gbps, nvlink_domain) or a preset: jean-zay-a100, jean-zay-v100, "
                          "dgx-a100-superpod, dgx-h100-superpod, dgx-b200, gb200-nvl72")
    add("--nvlink-domain", type=_positive_int, default=None,
        help="GPUs one NVLink fabric joins across nodes, a whole number of nodes (GB200 NVL72: 72 = 18 trays of 4, "
             "the default for GB200; 64 when a job gets 16 trays of each rack); TP, EP and CP groups inside it run "
             "at NVLink speed")
    add("--calibration", help="calibration YAML from `tune calibrate`, overrides catalog figures")
    add("--inter-node-gbps", type=_positive_float, help="inter-node bandwidth per node, Gbit/s")
    add("--intra-node-gbps", type=_positive_float, help="intra-node bandwidth per GPU and direction, Gbit/s")
    add("--framework", choices=FRAMEWORKS, default=None,
        help="framework whose rules and costs apply (default: the --emit kind, else per model: megatron-deepspeed "
             "(bigscience fork) when it can express the model, else megatron-lm; the output says which)")
    add("--global-batch", type=_positive_int, help="global batch in sequences (default: the model's)")
    add("--seq-len", type=_positive_int, help="sequence length (default: the model's)")
    add("--precision", choices=PRECISIONS, default=None, help="bf16 (default; fp16 on GPUs without bf16) | fp16 | fp32")
    add("--optimizer", choices=OPTIMIZERS, default="adamw",
        help="optimizer, for its memory per parameter (default adamw)")
    add("--fp8-recipe", choices=("delayed", "tensorwise", "rowwise", "mxfp8", "blockwise"), default=None,
        help="with --precision fp8: Transformer Engine's scaling, delayed (default; amax history) or tensorwise "
             "(current scaling, as Megatron-Bridge's H100 recipes), block-scaled mxfp8 (Blackwell: a scale per 32 "
             "elements) or blockwise (DeepSeek-V3's 1x128 / 128x128 tiles); torchtitan: tensorwise, rowwise or mxfp8")
    add("--fp8-activations", choices=fp8.ACTIVATION_RECIPES, default=None,
        help="with --precision fp8: what is kept for the backward and dispatched to the experts: te (default; "
             "Transformer Engine's FP8 GEMM-input copies) or deepseek (DeepSeek-V3 report Sec. 3.3.3: Linear inputs "
             "cached in FP8 only, attention output in E5M6, SwiGLU inputs in FP8 with the output recomputed, FP8 "
             "dispatch; needs --fp8-recipe blockwise; planned, not emitted)")
    add("--optimizer-state-dtype", choices=("fp32", "bf16"), default=None,
        help="Adam's moments: fp32 (default) or bf16 (DeepSeek-V3; Megatron-LM --use-precision-aware-optimizer "
             "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16, with the distributed optimizer)")
    add("--pp-schedule", choices=PP_SCHEDULES, default=None,
        help="--framework fsdp: torchtitan's pipeline schedule (default 1F1B; Interleaved1F1B where VPP > 1; DualPipeV "
             "two stages a rank); --framework megatron-lm: DualPipe, DeepSeek-V3's bidirectional schedule, planned "
             "but not emitted (Megatron-LM has none)")
    add("--torch-compile", action="store_true", help="--framework fsdp: torchtitan with torch.compile")
    add("--async-tp", action="store_true", help="--framework fsdp: torchtitan's async TP (needs --torch-compile)")
    add("--grad-reduce-dtype", choices=("fp32", "bf16"), default=None,
        help="Megatron-LM's main-grad buffer and its reduce: fp32 (default) or bf16 (--grad-reduce-in-bf16)")
    add("--optimizer-offload", type=float, default=None, metavar="FRACTION",
        help="Megatron-LM: keep this fraction of the optimizer states on the host and step it there "
             "(--optimizer-cpu-offload --optimizer-offload-fraction); costs PCIe and CPU-Adam time")
    add("--no-offload-search", action="store_true",
        help="Megatron-LM MoE models: do not search activation offload or CPU optimizer offload on layouts memory "
             "rules out (plan's default); --activation-offload / --optimizer-offload still plan the user's")
    add("--flops-attention", choices=flops.ATTENTION_COUNTS, default="full",
        help="how TFLOPs and MFU count attention's s^2 work: full (default; Narayanan et al. 2021 Eq. 3) or causal "
             "(half: Megatron-Bridge, recent NeMo); step times do not change")
    add("--overlap", default=None, metavar="LIST",
        help="Megatron-LM communication overlapped with compute: a comma list of grad-reduce, param-gather, tp-comm, "
             "p2p, or none (default grad-reduce,param-gather,p2p: --overlap-grad-reduce --overlap-param-gather and "
             "Megatron's overlapped p2p in interleaved 1F1B; tp-comm adds --tp-comm-overlap, with SP; ep-a2a "
             "--overlap-moe-expert-parallel-comm, MoE with EP; shared-expert --moe-shared-expert-overlap)")
    add("--rampup", nargs=3, type=_positive_int, metavar=("START", "INCREMENT", "SAMPLES"),
        help="batch-size rampup; every rampup batch size becomes a constraint (default: the model's own)")
    add("--no-rampup", action="store_true", help="ignore the model's default rampup")
    add("--recompute", help="comma list of recompute modes to consider: none, selective, full; Megatron-LM's "
                            "partial recompute block (the first N layers of each model chunk checkpointed; plan "
                            "picks the smallest N that fits; block-N fixes N) and uniform[-N]; torchtitan's "
                            "selective-op and selective-layer[-N] (plan's default: none,selective,full,block; "
                            "tune's: none,selective,full)")
    add("--zero", help="comma list of ZeRO stages / FSDP strategies to consider (0,1,2,3)")
    add("--cp", help="comma list of context-parallel sizes to consider (default: powers of two keeping >= 8K tokens a rank)")
    add("--ep", help="comma list of expert-parallel sizes to consider (default: divisors of the expert count)")
    add("--moe-capacity-factor", type=_positive_float, help="MoE expert capacity factor (default: dropless)")
    add("--activation-offload", metavar="MODULES", default=None,
        help="Megatron-LM's fine-grained activation offload: comma list of modules whose inputs go to the host "
             "between forward and backward (attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, "
             "moe_act)")
    add("--cuda-graphs", metavar="SCOPES", default=None,
        help="Megatron-LM's CUDA graphs: comma list of capture scopes (layer, attn, mlp, moe, moe_router, "
             "moe_preprocess, full_iteration; --cuda-graph-impl / --cuda-graph-scope): their host launches replayed "
             "as one graph. A dropless MoE syncs with the host, so only attn, moe_router and moe_preprocess take it")
    add("--moe-dispatcher", choices=("alltoall", "allgather", "deepep", "hybridep"), default=None,
        help="Megatron-LM's MoE token dispatcher (default alltoall): allgather gathers every token over the EP "
             "group; deepep / hybridep are the flex dispatcher's backends, sending a token once per GPU that holds "
             "any of its experts")
    add("--max-mbs", type=_positive_int, default=16,
        help="largest micro-batch to try (every value dividing the per-replica batch)")
    for name in PINNABLE:
        add(f"--{name}", type=_positive_int, default=None, dest=f"pin_{name}",
            help=f"pin {name.upper()} (like --gpus): only layouts with this {name.upper()} are considered")
    add("--memory-fraction", type=_positive_float, default=0.75,
        help="layouts whose model states (weights, gradients, optimizer) exceed this fraction of GPU memory are "
             "marked in the note column (advisory, default 0.75); only the predicted total against memory minus "
             "--memory-headroom rules a layout out")
    add("--memory-headroom", type=float, default=0.05, help="fraction of GPU memory kept free (default 0.05)")
    p.add_argument("--flash-attention", dest="flash_attention", action="store_true", default=None,
                   help="attention without the s^2 matrices (default: on except for megatron-deepspeed)")
    p.add_argument("--no-flash-attention", dest="flash_attention", action="store_false",
                   help="the opposite of --flash-attention: attention scores materialised (s^2 per head)")
    add("--attention-kernel", choices=tuple(attention.KERNELS), default=None,
        help="the attention core's kernel: fa1 | fa2 | fa3 (FlashAttention 1/2/3), cudnn (cuDNN fused attention), "
             "fused-softmax (batched GEMMs + Megatron's fused softmax), unfused (batched GEMMs + PyTorch softmax "
             "ops); default: what the framework runs on the GPU (Megatron-LM + TE: cudnn on Hopper, fa2 on Ampere; "
             "torch SDPA: fa2; Megatron-DeepSpeed: fa2 microsoft, fa1 bigscience); fused ones imply --flash-attention")
    add("--eager-ops", action="store_true",
        help="cost the element-wise ops (SwiGLU, RoPE, residual adds, dropout) as PyTorch ops, one kernel each, under "
             "a Megatron framework, which fuses them; for a trainer outside plantune's emitters (Hagemann et al.'s)")
    add("--unfused-norm", action="store_true",
        help="cost the norms as PyTorch ops (Hugging Face's LlamaRMSNorm), not one fused kernel: more activation "
             "memory and HBM traffic; for a trainer outside plantune's emitters, which all fuse them")
    add("--train-tokens", type=_positive_float, help="tokens to train (for days / GPU-hours; default: the model's)")


def _split(text: str | None, kind: type, flag: str) -> tuple | None:
    if text is None:
        return None
    example = {"--recompute": "none,full", "--zero": "0,1", "--cp": "1,2", "--ep": "1,8"}.get(flag, "1,2")
    try:
        values = tuple(kind(x.strip()) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError(f"{flag} {text!r}: expected a comma list, e.g. {flag} {example}") from None
    if not values:      # '' or ',,,' named nothing: the defaults would apply without a word
        raise InputError(f"{flag} {text!r} names no value; give a comma list, e.g. {flag} {example}, or leave "
                         f"{flag} out for its default")
    return values


def cluster_from_args(args: argparse.Namespace) -> ClusterSpec:
    if args.cluster:
        cluster = load_cluster(args.cluster, gpus=args.gpus, nodes=args.nodes,
                               nvlink_domain=getattr(args, "nvlink_domain", None))
    else:
        if args.gpus is None and args.nodes is None:
            raise InputError("give --gpus N (or --nodes N, or --cluster FILE)")
        cluster = make_cluster(gpu=args.gpu or "A100-80GB", gpus=args.gpus, nodes=args.nodes,
                               gpus_per_node=args.gpus_per_node, inter_node_gbps=args.inter_node_gbps,
                               intra_node_gbps=args.intra_node_gbps,
                               nvlink_domain=getattr(args, "nvlink_domain", None))
    if args.calibration:
        cluster = apply_calibration(cluster, args.calibration)
    return cluster


DEFAULT_TARGETS = (Target("megatron-deepspeed", "bigscience"), Target("megatron-lm"))
"""per-model default framework: the first of these that can express the model"""


def choose_framework(args: argparse.Namespace, model: ModelSpec, cluster: ClusterSpec) -> tuple[str, str]:
    """(framework, why): --framework, else the --emit kind, else the first default target that expresses the model."""
    if args.framework:
        return args.framework, "--framework"
    emit = getattr(args, "emit", None)
    if emit:
        return emit, f"--emit {emit}"
    flavor = getattr(args, "emit_flavor", None) or "bigscience"
    refused = []
    for target in DEFAULT_TARGETS:
        if target.framework == "megatron-deepspeed":
            target = Target("megatron-deepspeed", flavor)
        probe = TrainingSpec(global_batch=1, seq_len=1, framework=target.framework, flavor=target.flavor or "bigscience",
                             flash_attention=_flash_default(args, target.framework, flavor))
        problems = [v for v in model_violations(model, probe, cluster, target) if v.reason.value == "model_feature"]
        if not problems:
            why = "default for this model" + (f" ({refused[0]})" if refused else "")
            return target.framework, why
        refused.append(problems[0].detail.split(";")[0])
    return "fsdp", f"default for this model ({'; '.join(refused)})"


def _flash_default(args: argparse.Namespace, framework: str, flavor: str) -> bool:
    kernel = getattr(args, "attention_kernel", None)
    if kernel:
        fused = kernel in attention.FUSED
        if args.flash_attention is not None and args.flash_attention != fused:
            flag = "--flash-attention" if args.flash_attention else "--no-flash-attention"
            raise InputError(f"{flag} contradicts --attention-kernel {kernel} ({attention.KERNELS[kernel]}); "
                             "drop one of them")
        return fused
    if args.flash_attention is not None:
        return args.flash_attention
    return not (framework == "megatron-deepspeed" and flavor == "bigscience")  # the BigScience fork has no flash


def _pins(args: argparse.Namespace, cluster: ClusterSpec) -> tuple[tuple[str, int], ...]:
    pins = tuple((name, getattr(args, f"pin_{name}")) for name in PINNABLE
                 if getattr(args, f"pin_{name}", None) is not None)
    d, world = dict(pins), cluster.world_size
    for name in ("tp", "pp", "dp"):
        if name in d and world % d[name]:
            raise InputError(f"--{name} {d[name]} does not divide the {world} GPUs; pin a divisor of {world}")
    if all(k in d for k in ("tp", "pp", "dp")) and world % (d["tp"] * d["pp"] * d["dp"]):   # CP may fill the rest
        raise InputError(f"--tp {d['tp']} x --pp {d['pp']} x --dp {d['dp']} = {d['tp'] * d['pp'] * d['dp']} does not "
                         f"divide {world} GPUs; leave one of them out")
    return pins


def training_from_args(args: argparse.Namespace, model: ModelSpec, cluster: ClusterSpec) -> TrainingSpec:
    precision = args.precision or ("bf16" if cluster.gpu.peak_bf16_flops else "fp16")
    fp8.require_hardware(cluster.gpu, precision)
    rampup = None
    if args.rampup:
        rampup = Rampup(start=args.rampup[0], increment=args.rampup[1], samples=args.rampup[2])
    elif not args.no_rampup:
        rampup = model.rampup
    framework, _ = choose_framework(args, model, cluster)
    flavor = getattr(args, "emit_flavor", None) or "bigscience"
    flash = _flash_default(args, framework, flavor)
    kernel = getattr(args, "attention_kernel", None) or ""
    if kernel:
        attention.require_published(cluster.gpu, kernel)
    pins = _pins(args, cluster)
    if getattr(args, "fp8_recipe", None) and precision != "fp8":
        raise InputError(f"--fp8-recipe applies to FP8 training only (precision here: {precision}); "
                         "add --precision fp8 or drop --fp8-recipe")
    if getattr(args, "fp8_recipe", None) == "mxfp8" and not cluster.gpu.mx_block_scaling:
        raise InputError(f"--fp8-recipe mxfp8: {cluster.gpu.id}'s tensor cores take no MX block scales (Blackwell's "
                         "B200/GB200 and MI355X do); use --fp8-recipe blockwise or tensorwise, or --gpu B200")
    if getattr(args, "optimizer_offload", None) and framework != "megatron-lm":
        raise InputError(f"--optimizer-offload is Megatron-LM's (--optimizer-cpu-offload); the framework here is "
                         f"{framework}: add --framework megatron-lm or drop --optimizer-offload")
    if getattr(args, "no_offload_search", False) and (framework != "megatron-lm" or not moe.is_moe(model)):
        raise InputError(f"--no-offload-search: plan searches offload only on Megatron-LM MoE models (here "
                         f"{framework}, {model.name}{'' if moe.is_moe(model) else ', dense'}); drop it")
    if getattr(args, "fp8_activations", None) and precision != "fp8":
        raise InputError(f"--fp8-activations applies to FP8 training only (precision here: {precision}); "
                         "add --precision fp8 or drop --fp8-activations")
    if getattr(args, "grad_reduce_dtype", None) and framework != "megatron-lm":
        raise InputError(f"--grad-reduce-dtype is Megatron-LM's (--grad-reduce-in-bf16); the framework here is "
                         f"{framework}: add --framework megatron-lm or drop --grad-reduce-dtype")
    gbs = args.global_batch or model.global_batch
    if gbs is None:
        raise InputError(f"model {model.name} has no default global batch; give --global-batch N")
    check_training(gbs, rampup, "--rampup" if args.rampup else f"model {model.name}'s rampup")
    return TrainingSpec(global_batch=gbs, seq_len=args.seq_len or model.seq_len, precision=precision,
                        optimizer=args.optimizer, framework=framework, flavor=flavor, rampup=rampup, pins=pins,
                        memory_fraction=args.memory_fraction, memory_headroom=args.memory_headroom,
                        flash_attention=flash, attention_kernel=kernel, train_tokens=args.train_tokens or model.train_tokens,
                        max_mbs=args.max_mbs,
                        recompute_options=_split(args.recompute, str, "--recompute") or getattr(
                            args, "recompute_default", RECOMPUTE),
                        zero_options=_split(args.zero, int, "--zero") or (0, 1, 2, 3),
                        cp_options=_split(args.cp, int, "--cp"), ep_options=_split(args.ep, int, "--ep"),
                        moe_capacity_factor=args.moe_capacity_factor,
                        moe_dispatcher=getattr(args, "moe_dispatcher", None) or "alltoall",
                        activation_offload=_split(getattr(args, "activation_offload", None), str,
                                                  "--activation-offload") or (),
                        cuda_graphs=_split(getattr(args, "cuda_graphs", None), str, "--cuda-graphs") or (),
                        fp8_recipe=getattr(args, "fp8_recipe", None) or "delayed",
                        fp8_activations=getattr(args, "fp8_activations", None) or "te",
                        optimizer_state_dtype=getattr(args, "optimizer_state_dtype", None) or "fp32",
                        grad_reduce_dtype=getattr(args, "grad_reduce_dtype", None) or "fp32",
                        optimizer_offload=getattr(args, "optimizer_offload", None) or 0.0,
                        offload_search=not getattr(args, "no_offload_search", False),
                        overlap=_overlap(getattr(args, "overlap", None)),
                        flops_attention=getattr(args, "flops_attention", None) or "full",
                        pp_schedule=getattr(args, "pp_schedule", None) or "",
                        torch_compile=bool(getattr(args, "torch_compile", False)),
                        async_tp=bool(getattr(args, "async_tp", False)),
                        fused_norm=not getattr(args, "unfused_norm", False),
                        eager_ops=bool(getattr(args, "eager_ops", False)))


def _overlap(text: str | None) -> tuple[str, ...] | None:
    """--overlap LIST -> the names (TrainingSpec checks them); "none" -> ()."""
    if text is None:
        return None
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    if not names:
        raise InputError(f"--overlap {text!r} names nothing; give a comma list, e.g. --overlap grad-reduce,p2p, or "
                         "--overlap none")
    return () if names == ("none",) else names


def setup_from_args(args: argparse.Namespace) -> tuple[ModelSpec, ClusterSpec, TrainingSpec]:
    """Flags -> typed model, cluster and training specs, before any work (shared with `tune`)."""
    check_flags(args)
    model = at_seq_len(load_model(args.model), args.seq_len)
    cluster = cluster_from_args(args)
    return model, cluster, training_from_args(args, model, cluster)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="plan", description="Rank the parallel layouts of a training run: TP, PP, DP, MBS, GAS, "
                                         "recompute, ZeRO/FSDP, with predicted memory and TFLOPs per GPU.")
    add_setup_arguments(p, model_required=False)
    p.set_defaults(recompute_default=recompute_modes.PLAN_DEFAULT)   # tune's parser keeps the classic three
    p.add_argument("--top", type=_positive_int, default=10, help="rows to show (default 10)")
    p.add_argument("--format", choices=FORMATS, default="table")
    p.add_argument("--explain", nargs="?", const="", default=None, metavar="CONFIG",
                   help='one configuration, e.g. "tp=4,pp=12,mbs=2,recompute=full,zero=1": its breakdown or '
                        "every reason it is ruled out (with --from: the YAML's configuration)")
    p.add_argument("--pick", type=_positive_int, help="with --emit: emit the configuration of this rank")
    p.add_argument("--emit", choices=("megatron-deepspeed", "megatron-lm", "fsdp"),
                   help="write a ready-to-run setup of the chosen configuration into --out")
    p.add_argument("--emit-flavor", "--emit_flavor", choices=("bigscience", "microsoft"), default=None,
                   help="Megatron-DeepSpeed fork whose rules plan and emit follow: bigscience (default; "
                        "bigscience-workshop/Megatron-DeepSpeed) or microsoft (deepspeedai/Megatron-DeepSpeed: "
                        "GQA, RMSNorm, FlashAttention, ZeRO-2/3 without PP, selective recompute, SP); with --from: "
                        "the file's fork unless given")
    p.add_argument("--torchtitan-version", "--torchtitan_version", choices=TORCHTITAN_VERSIONS,
                   default=TORCHTITAN_VERSIONS[0], help="with --emit fsdp: the torchtitan release to write for: "
                   f"{TORCHTITAN_VERSIONS[0]} (default; a Python config module, plantune_torchtitan.py) or "
                   f"{TORCHTITAN_VERSIONS[1]} (torchtitan.toml)")
    p.add_argument("--out", help="folder for --emit (default run/); files already there need --force")
    p.add_argument("--force", action="store_true", help="with --emit: replace the files --out already holds")
    p.add_argument("--reservation", help="SLURM reservation for launch.sbatch")
    p.add_argument("--time-limit", "--time_limit", type=_positive_int, default=20, metavar="HOURS",
                   help="launch.sbatch --time in hours (default 20); Megatron exits 10 minutes before it")
    p.add_argument("--from", dest="from_yaml", help="plantune plan.yaml to read back (and re-render with --emit)")
    p.add_argument("--rampup-schedule", action="store_true",
                   help="print the schedule for the rampup (nodes and MBS per batch size, seed 003)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


# -- output --------------------------------------------------------------------------------------------------
def _row(e: Estimate, cluster: ClusterSpec, framework: str, fraction: float = 0.75) -> dict:
    d = e.to_dict()
    mem = d["memory_gb_per_gpu"]
    d["headroom"] = f"{1 - mem * 1e9 / cluster.gpu.memory_bytes:.0%}" if mem is not None else "N/A"
    d["sp"] = int(d["sp"])
    d["note"] = f"states>{fraction:.0%}" if e.advice else ""
    if framework == "fsdp":
        d["zero"] = e.candidate.fsdp_strategy
    return d


def render_table(p: Plan, top: int, elapsed_s: float, framework_why: str = "") -> str:
    m, cl, t = p.model, p.cluster, p.training
    active = f" ({m.active_params / 1e9:.1f}B active, {m.num_experts} experts top-{m.moe_topk})" if m.num_experts else ""
    named = f"{m.name} ({m.architecture}, config.json)" if m.architecture else m.name
    lines = [f"{named}: {m.params / 1e9:.1f}B params{active}, {m.layers} layers, hidden {m.hidden}, heads {m.heads}"
             f"{f' (kv {m.kv_heads})' if m.kv_heads != m.heads else ''}, seq {t.seq_len}",
             f"cluster: {cl.nodes} nodes x {cl.gpus_per_node} {cl.gpu.id} = {cl.world_size} GPUs "
             f"({cl.gpu.memory_bytes / 2**30:.0f} GiB each"
             + (f"; NVLink domains of {cl.nvlink_domain} GPUs" if cl.nvlink_domain else "")
             + f"); framework {t.framework}"
             + (f" ({t.flavor} fork)" if t.framework == "megatron-deepspeed" else "")
             + (f" [{framework_why}]" if framework_why else "") + f", {t.precision}"
             + (" (FP8 GEMMs; MFU against the bf16 peak)" if t.precision == "fp8" else "") + ", "
             f"{t.optimizer}, global batch {t.global_batch}"
             + (f", rampup {t.rampup.start} {t.rampup.increment} {t.rampup.samples}" if t.rampup else "")
             + (", norms as PyTorch ops (--unfused-norm)" if not t.fused_norm else "")
             + (", element-wise ops as PyTorch ops (--eager-ops)" if t.eager_ops else "")
             + (f", {t.optimizer_offload:g} of the optimizer on the host (--optimizer-offload)"
                if t.optimizer_offload else "")
             + (f", CUDA graphs {'+'.join(t.cuda_graphs)} (--cuda-graph-impl {cuda_graphs.impl(t.cuda_graphs)})"
                if t.cuda_graphs else ""),
             cl.network_line(),
             compute_line(cl, t.framework),
             attention_kernel(m, cl, t)[2],
             f"{p.total} candidates scored in {elapsed_s:.2f} s; {p.survivors} fit, "
             f"{p.total - p.survivors} ruled out", ""]
    extra = [k for k in ("cp", "ep", "etp") if any(getattr(e.candidate, k) > 1 for e in p.candidates[:top])]
    offloads = [e for e in p.candidates[:top] if e.candidate.offload]   # plan's activation offload: a column then
    opt_offloads = [e for e in p.candidates[:top] if e.candidate.opt_offload]   # and its CPU optimizer offload
    columns = TABLE_COLUMNS[:4] + tuple(extra) + TABLE_COLUMNS[4:7] + (("offload",) if offloads else ()) \
        + (("opt_offload",) if opt_offloads else ()) + TABLE_COLUMNS[7:]   # CP/EP/ETP columns when any row uses them
    dicts = [_row(e, cl, t.framework, t.memory_fraction) for e in p.candidates[:top]]   # one to_dict a row
    rows = [[d[c] for c in columns] for d in dicts]
    best_s = p.candidates[0].step_time_s
    for row, e in zip(rows, p.candidates[:top]):
        row[0] = f"{row[0]}~" if e.rank > 1 and tied(best_s, e.step_time_s) else row[0]
    headers = ["#", "TP", "PP", "DP", *(k.upper() for k in extra), "MBS", "GAS", "recompute",
               *(["offload"] if offloads else []), *(["opt off"] if opt_offloads else []),
               "ZeRO" if t.framework != "fsdp" else "FSDP", "SP",
               "VPP", "mem GB/GPU", "free", "step s", "TFLOPs", "HW TFLOPs", "MFU", "tokens/s", "note"]
    lines.append(f"Top {len(rows)} by predicted model TFLOPs per GPU (model FLOPs: no recompute counted; HW: with it; "
                 f"{flops.ATTENTION_COUNT_WORDS[t.flops_attention]})")
    lines.append(simple_table(rows, headers=headers, floatfmt=(".0f",) * (7 + len(extra)) + ("",) * bool(offloads)
                             + ("g",) * bool(opt_offloads) + (".0f",) * 3
                             + (".1f", "", ".2f", ".1f", ".1f", ".3f", ".0f", "")))
    if offloads:   # what each offloaded layout's offload costs (planner.offload)
        lines.append("offload: the modules whose inputs go to the host (Megatron-LM --fine-grained-activation-"
                     "offloading --offload-modules), searched where nothing else lets a layout fit; per row: GPU memory "
                     "saved, step seconds of PCIe copies exposed (hidden under compute)")
        lines += [f"  #{e.rank}: saves {c['saves_gb']:.2f} GB, costs +{c['exposed_s']:.3f} s "
                  f"({c['hidden_s']:.3f} s hidden)" for e in offloads if (c := e.offload_cost)]
    if opt_offloads:   # what each row's CPU optimizer offload costs (planner.offload)
        lines.append("opt off: the fraction of the optimizer (fp32 master weights, Adam moments) on the host "
                     "(Megatron-LM --optimizer-cpu-offload --optimizer-offload-fraction), searched where nothing else "
                     "lets a layout fit; per row: GPU memory saved, step seconds of the host's step (D2H, CPU Adam, "
                     "H2D) added, pinned host memory a node")
        lines += [f"  #{e.rank}: saves {c['saves_gb']:.2f} GB, costs +{c['added_s']:.3f} s, host "
                  f"{c['host_gb_per_node']:.0f} GB a node" for e in opt_offloads if (c := e.opt_offload_cost)]
    if any(e.advice for e in p.candidates[:top]):
        lines.append(f"note states>{t.memory_fraction:.0%}: weights+grads+optimizer above {t.memory_fraction:.0%} of "
                     "GPU memory, seed 004's first guess (advisory: only the predicted total rules out)")
    lines.append(f"~ : within {RANKING_ERROR:.0%} of the best, the model's measured error inside a table of published "
                 "runs (tests/bench/validate.py): tied; measure them (tune) before choosing")
    best = p.candidates[0]
    if best.throughput and best.throughput.days_to_train:
        lines.append(f"\nBest: {best.throughput.days_to_train:.1f} days / "
                     f"{best.throughput.gpu_hours_to_train:,.0f} GPU-hours for {t.train_tokens / 1e9:,.0f}B tokens")
    lines.append("\nRuled out (by first reason):")
    prune_rows = [[r.value, n, f"{p.examples[r][0].label()}: {p.examples[r][1].detail}"]
                  for r, n in sorted(p.pruned.items(), key=lambda kv: -kv[1])]
    lines.append(simple_table(prune_rows, headers=["reason", "count", "example"], maxcolwidths=[None, None, 100]))
    return "\n".join(lines)


def render_explain(e: Estimate, cluster: ClusterSpec, training: TrainingSpec | None = None,
                   model: ModelSpec | None = None) -> str:
    d = e.to_dict(detail=True)
    out = [f"{e.candidate.label()}: {'fits' if e.fits else 'RULED OUT'}"]
    for v in e.reasons:
        out.append(f"  - {v.reason.value}: {v.detail}")
    for v in e.advice:
        out.append(f"  (advice) {v.reason.value}: {v.detail}")
    if e.memory:
        mb = d["memory_breakdown_gb"]
        out.append(f"\nMemory per GPU ({mb['stage']} stage, GB = 1e9 bytes; {cluster.gpu.id} has "
                   f"{cluster.gpu.memory_bytes / 1e9:.1f} GB):")
        # the step's buffers and DeepSpeed's reserve only where the plan has them (fp16 DeepSpeed ZeRO), not as 0 rows
        names = {"pinned_bytes": "pinned reserve", "reserved_bytes": "released reserve (not in total)"}
        out.append(simple_table([[names.get(k, k.removesuffix("_bytes")), v] for k, v in mb.items()
                                 if k.endswith("_bytes") and (v or k not in ("step_bytes", "pinned_bytes",
                                                                             "reserved_bytes"))]
                                + [["total", d["memory_gb_per_gpu"]]], floatfmt=".2f"))
    if e.time:
        out.append("\nStep time (s):")
        out.append(simple_table([[k.removesuffix("_s"), v] for k, v in d["time_breakdown_s"].items()]
                                + [["step", d["step_time_s"]]], floatfmt=".3f"))
        out.append("\nTerms (the lines above are their sums; per-micro-batch terms also fill the bubble):")
        out.append(simple_table([[r["name"], r["kind"], r["exposed_s"], r["hidden_s"],
                                  r["flag"] if r["overlaps"] else "-"] for r in d["terms"]],
                                headers=["term", "kind", "exposed s", "hidden s", "overlap flag"], floatfmt=".3f"))
        out.append(f"\nmodel TFLOPs/GPU {d['model_tflops_per_gpu']:.1f}, hardware TFLOPs/GPU "
                   f"{d['hardware_tflops_per_gpu']:.1f}, MFU {d['mfu']:.1%}, {d['tokens_per_s']:,.0f} tokens/s")
        if training is not None:
            out.append(flops.ATTENTION_COUNT_WORDS[training.flops_attention])
    if e.layer_ops and training is not None and model is not None:
        out.append("\n" + attention_kernel(model, cluster, training)[2])
    if e.layer_ops:
        out.append("\nOne layer's operations (one GPU, one micro-batch; backward = 2x forward; ms; FLOPs and bytes of the "
                   "forward; a MoE model's mean layer):")
        out.append(simple_table([[r["op"], r["class"], r["forward_s"] * 1e3, r["backward_s"] * 1e3,
                                  r["recompute_s"] * 1e3, f"{r['share']:.1%}",
                                  f"{r['forward_flops'] / 1e9:.3g}" if r["forward_flops"] else "-",
                                  f"{r['forward_bytes'] / 1e6:.3g}" if r["forward_bytes"] else "-"]
                                 for r in e.layer_ops]
                                + [["layer", "", sum(r["forward_s"] for r in e.layer_ops) * 1e3, "", "",
                                    "100%", "", ""]],
                                headers=["op", "class", "fwd ms", "bwd ms", "recompute ms", "share", "GFLOP", "MB"],
                                floatfmt=".3f"))
    return "\n".join(out)


def _explain_dict(est: Estimate, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> dict:
    """`--explain --format json`: the candidate's detail and the attention kernel its op table runs."""
    kernel, why, line = attention_kernel(model, cluster, training)
    return est.to_dict(detail=True) | {"attention": {"kernel": kernel, "why": why, "line": line}}


def render_savers(model, cluster: ClusterSpec, training: TrainingSpec, est: Estimate, targets) -> str:
    """What the candidate's memory savers cost: module recompute (recompute=modules:...) against none and the CPU
    optimizer offload against none, each as GPU memory saved and step time added (the same model, layout and
    estimate otherwise)."""
    if est.memory is None or est.time is None:
        return ""
    savers = []
    if recompute_modes.kind(est.candidate.recompute) == "modules":
        savers.append((f"recompute {est.candidate.recompute.removeprefix('modules:')} (--recompute-modules)",
                       training, replace(est.candidate, recompute="none")))
    if training.optimizer_offload:
        savers.append((f"optimizer offload {training.optimizer_offload:g} (--optimizer-offload-fraction)",
                       replace(training, optimizer_offload=0.0), est.candidate))
    if training.activation_offload:
        savers.append((f"activation offload {'+'.join(training.activation_offload)} (--offload-modules)",
                       replace(training, activation_offload=()), est.candidate))
    if est.candidate.offload:
        savers.append((f"activation offload {est.candidate.offload} (offload=, --offload-modules)", training,
                       replace(est.candidate, offload="")))
    if est.candidate.opt_offload:
        savers.append((f"optimizer offload {est.candidate.opt_offload:g} (opt_offload=, --optimizer-offload-fraction)",
                       training, replace(est.candidate, opt_offload=0.0)))
    lines = []
    for name, t, c in savers:
        base = estimate(model, cluster, t, c, targets=targets)
        lines.append(f"{name}: saves {(base.memory.total_bytes - est.memory.total_bytes) / 1e9:.2f} GB of GPU "
                     f"memory, costs {est.time.step_time_s - base.time.step_time_s:+.3f} s of step time")
    if training.cuda_graphs:   # time only: the graphs' memory pools are not modelled (planner.cuda_graphs)
        base = estimate(model, cluster, replace(training, cuda_graphs=()), est.candidate, targets=targets)
        lines.append(f"CUDA graphs {'+'.join(training.cuda_graphs)} (--cuda-graph-scope): "
                     f"{est.time.step_time_s - base.time.step_time_s:+.3f} s of step time against eager launches "
                     "(their memory pools not modelled)")
    if lines and est.host_gb_per_node is not None and (node := cluster.host_memory_bytes) is not None:
        lines.append(f"host memory the offloads pin: {est.host_gb_per_node:.1f} GB a node of its {node / 1e9:.0f} GB "
                     f"({cluster.gpu.id} reference system)")
    head = "Memory savers" + (" and CUDA graphs" if training.cuda_graphs else "")
    return (f"\n{head} (against the same layout without each):\n" + "\n".join(lines)) if lines else ""


def _dump(obj: object, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(obj, indent=2)
    import yaml   # here: only --format yaml writes YAML

    return yaml.safe_dump(obj, sort_keys=False)


def _csv(p: Plan, top: int) -> str:
    import csv   # here: only --format csv writes CSV

    buf = io.StringIO()
    rows = [e.to_dict() for e in p.candidates[:top]]
    writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))   # offload_cost: some
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


# -- commands ------------------------------------------------------------------------------------------------
def _setup(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, est: Estimate):
    """The emitter's RunSetup for an estimate, with the prediction it was chosen on."""
    from planner.emit import Prediction, RunSetup

    t = est.throughput
    prediction = None
    if t is not None and est.memory and est.time:
        prediction = Prediction(memory_gb_per_gpu=round(est.memory.total_gb, 3),
                                step_time_s=round(est.time.step_time_s, 3),
                                model_tflops_per_gpu=round(t.model_tflops_per_gpu, 3),
                                hardware_tflops_per_gpu=round(t.hardware_tflops_per_gpu, 3), mfu=round(t.mfu, 4))
    return RunSetup(model=model, cluster=cluster, training=training, candidate=est.candidate, prediction=prediction)


def _emit(args: argparse.Namespace, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
          est: Estimate, flavor: str | None = None) -> list[Path]:
    from planner.emit import emit

    return emit(_setup(model, cluster, training, est), args.emit, Path(args.out or "run"),
                flavor=flavor or training.flavor, reservation=args.reservation, time_hours=args.time_limit,
                force=args.force, torchtitan_version=args.torchtitan_version)


def targets_for(training: TrainingSpec, emit: str | None) -> tuple[Target, ...]:
    """What every layout must run on: the training's framework (and fork), and the --emit kind if another."""
    own = Target(training.framework, training.flavor)
    if not emit:
        return (own,)
    target = Target(emit, training.flavor)
    return (own,) if target == own else (own, target)


def check_expressible(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                      targets: tuple[Target, ...], emit: str | None) -> None:
    """One line naming what a target cannot express at all (checked before enumerating anything)."""
    problems = [v.detail for t in targets
                for v in model_violations(model, training, cluster, t, emit=t.framework == emit)]
    if problems:
        raise InputError(_grouped(dict.fromkeys(problems)))


def _grouped(details) -> str:
    """"T cannot express A; FIX" and "T cannot express B; FIX" as one "T cannot express A, B; FIX"."""
    groups: dict[tuple[str, str], list[str]] = {}
    for detail in details:
        target, sep, rest = detail.partition(" cannot express ")
        what, sep2, fix = rest.rpartition("; ")
        key = (target, fix) if sep and sep2 else (detail, "")
        groups.setdefault(key, []).append(what if sep and sep2 else "")
    return "; ".join(f"{target} cannot express {', '.join(whats)}; {fix}" if fix else target
                     for (target, fix), whats in groups.items())


def _refuse_unfit(est: Estimate) -> None:
    if not est.fits:
        raise InputError(f"{est.candidate.label()} is ruled out ({est.reasons[0].reason.value}: "
                         f"{est.reasons[0].detail}); pick a configuration that fits")


def _from_yaml(args: argparse.Namespace) -> int:
    """A plan file, checked by the same rules and memory model as `plan`; --emit re-renders it."""
    from planner.emit import load_plan_yaml, plan_target

    setup = load_plan_yaml(Path(args.from_yaml))
    kind, file_flavor = plan_target(Path(args.from_yaml))
    flavor = args.emit_flavor or file_flavor or "bigscience"
    training = replace(setup.training, flavor=flavor)
    target = Target(args.emit or kind, flavor)
    est = estimate(setup.model, setup.cluster, training, setup.candidate, targets=(target,))
    if args.emit:
        check_expressible(setup.model, setup.cluster, training, (target,), target.framework)
        _refuse_unfit(est)
        written = _emit(args, setup.model, setup.cluster, training, est, flavor=flavor)
        print(f"wrote {len(written)} files to {args.out or 'run'}: {', '.join(p.name for p in written)}")
    if args.explain is not None or not args.emit:
        print(_dump(_explain_dict(est, setup.model, setup.cluster, training), args.format)
              if args.format in ("json", "yaml")
              else render_explain(est, setup.cluster, training, setup.model))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.from_yaml:
        return _from_yaml(args)
    if not args.model:
        raise InputError("give --model (a preset such as 176B, a config.json or a model YAML), or --from plan.yaml")
    model, cluster, training = setup_from_args(args)
    _, why = choose_framework(args, model, cluster)
    targets = targets_for(training, args.emit)
    check_expressible(model, cluster, training, targets, args.emit)
    # said after the answer (stderr), so that a refusal stays one line
    note = f"plan: note: {model.source}\n" if args.seq_len is None and HF_SEQ_NOTE in model.source else ""
    raised = positions_note(model)   # --seq-len past the model's positions: planned and emitted with them raised
    note += f"plan: note: {raised}\n" if raised else ""
    if training.pp_schedule == dualpipe.DUALPIPE:   # planned as DeepSeek ran it; no emitter writes it
        note += (f"plan: note: --pp-schedule DualPipe is DeepSeek-V3's schedule (planner.dualpipe), planned here as "
                 f"their run; no framework plantune emits for runs it (--emit megatron-lm refuses it). {dualpipe.EQUIVALENT}\n")
    if training.deepseek_fp8_storage:   # the same: DeepSeek's own framework's recipe
        note += f"plan: note: {fp8.DEEPSEEK_NOTE}\n"
    if args.explain:
        cand = parse_explain(args.explain, world=cluster.world_size, global_batch=training.global_batch)
        est = estimate(model, cluster, training, cand, targets=targets)
        if args.emit:
            _refuse_unfit(est)
            written = _emit(args, model, cluster, training, est)
            print(f"wrote {len(written)} files to {args.out or 'run'}: {', '.join(p.name for p in written)}")
        if args.format in ("json", "yaml"):
            print(_dump(_explain_dict(est, model, cluster, training), args.format))
        else:
            print(render_explain(est, cluster, training, model))
            print(render_savers(model, cluster, training, est, targets))
        sys.stderr.write(note)
        return 0
    if args.explain == "":
        raise InputError('--explain needs a configuration, e.g. --explain "tp=4,pp=12,mbs=2,recompute=full,zero=1"')
    want_schedule = training.rampup is not None and (args.rampup_schedule or args.format == "table")
    t0 = time.perf_counter()
    # the schedule's layout is the training's own target's (a second --emit target is not asked of it)
    same_rules = targets == targets_for(training, None)
    result = plan(model, cluster, training, targets=targets, free_best=want_schedule and same_rules,
                  keep=max(args.top, args.pick or 1))   # the rows printed, and the one --pick emits
    elapsed = time.perf_counter() - t0
    chosen = None
    if args.emit:
        from planner.emit import render

        rank = args.pick or 1
        if rank > result.survivors:
            raise InputError(f"--pick {rank}: only {result.survivors} configurations fit")
        chosen = result.candidates[rank - 1]
        # refuse before printing anything: render() checks every rule and writes nothing; --out keeps a user's files
        files = render(_setup(model, cluster, training, chosen), args.emit, flavor=training.flavor,
                       reservation=args.reservation, time_hours=args.time_limit,
                       torchtitan_version=args.torchtitan_version)
        check_out(Path(args.out or "run"), files, force=args.force)
    schedule = _schedule(result, same_rules) if want_schedule else None
    if args.format == "table":
        print(render_table(result, args.top, elapsed, framework_why=why))
        if schedule:
            print(render_schedule(schedule))
    elif args.format == "csv":
        print(_csv(result, args.top), end="")
    else:
        doc = result.to_dict(top=args.top)
        doc["framework_choice"] = why
        if schedule is not None:
            doc["rampup_schedule"] = [r.to_dict() for r in schedule]
        print(_dump(doc, args.format))
    if chosen is not None:
        written = _emit(args, model, cluster, training, chosen)
        print(f"\nwrote {len(written)} files to {args.out or 'run'}: {', '.join(p.name for p in written)}",
              file=sys.stderr if args.format != "table" else sys.stdout)
    sys.stderr.write(note)
    return 0


def _schedule(result: Plan, same_rules: bool) -> list:
    """Seed 003's NNODES / BS / MBS table, from the best layout of the training's target without the rampup
    constraint: `Plan.free_best`, found in the plan's own pass, when the plan had no other target."""
    training = result.training
    assert training.rampup is not None
    free_training = replace(training, rampup=None)
    if not same_rules:
        return rampup_schedule(plan(result.model, result.cluster, free_training, allow_empty=True), training.rampup)
    free = replace(result, training=free_training,
                   candidates=[result.free_best] if result.free_best is not None else [])
    return rampup_schedule(free, training.rampup)


def render_schedule(rows: list) -> str:
    return ("\nRampup schedule if you relaunch as the batch grows (seed 003): each batch size's fastest layout\n"
            + simple_table([[f"{r.first_batch}-{r.last_batch}" if r.first_batch != r.last_batch else r.first_batch,
                             r.nodes, r.gpus, r.tp, r.pp, r.dp, r.mbs, r.recompute, f"{r.samples_per_s:.2f}"]
                            for r in rows],
                           headers=["BS", "NNODES", "GPUs", "TP", "PP", "DP", "MBS", "recompute", "samples/s"]))


_FROM_FLAGS = ("from_yaml", "emit", "emit_flavor", "out", "reservation", "time_limit", "format", "explain", "debug",
               "force", "torchtitan_version")
"""what `plan --from` honours; every other flag would be ignored (the file holds the setup)"""
_EMIT_FLAGS = ("pick", "out", "reservation", "time_limit", "force", "torchtitan_version")
"""flags that only shape what --emit writes (--emit-flavor also picks the rules plan ranks with)"""


def check_flag_combinations(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Refuse flags that would be silently ignored in this combination."""
    defaults = vars(parser.parse_args([]))
    given = [k for k, v in vars(args).items() if v != defaults.get(k)]
    flag = {"from_yaml": "--from"}

    def names(keys: list[str]) -> str:
        return ", ".join(flag.get(k, "--" + k.replace("_", "-")) for k in keys)
    if args.from_yaml:
        ignored = [k for k in given if k not in _FROM_FLAGS]
        if ignored:
            raise InputError(f"--from takes the model, cluster and training from {args.from_yaml}, so {names(ignored)} "
                             "would be ignored; drop them, or drop --from and give the whole setup as flags")
        if args.explain:
            raise InputError(f"--explain {args.explain!r} with --from: the configuration is the one in "
                             f"{args.from_yaml}; give --explain alone, or drop --from")
    without_emit = [k for k in given if k in _EMIT_FLAGS and not args.emit]
    if without_emit:
        raise InputError(f"{names(without_emit)} only appl{'ies' if len(without_emit) == 1 else 'y'} with --emit; "
                         "add --emit FRAMEWORK or drop them")
    if args.explain and not args.from_yaml:
        ignored = [k for k in given if k in ("top", "pick", "rampup_schedule")]
        if ignored:
            raise InputError(f"{names(ignored)} {'does' if len(ignored) == 1 else 'do'} not apply to --explain "
                             "(one configuration); drop them")


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    finally:
        if argv is None:   # the `plan` command's own process (console script, python -m planner), about to exit
            # everything it holds (a plan's ~100,000 objects and caches, the imports') moved out of the collector's
            # sight: the interpreter's exit runs two full collections that walked them all for nothing (~20 ms of
            # `plan --model 176B`); what refcounting frees is freed as before, and the OS takes the rest
            gc.freeze()


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_flag_combinations(args, parser)
        return run(args)
    except PlantuneError as err:
        if args.debug:
            raise
        print("plan: error: " + " ".join(str(err).splitlines()), file=sys.stderr)  # one line, whatever the path
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
