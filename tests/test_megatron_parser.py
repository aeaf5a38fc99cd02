"""Every Megatron argument set plantune emits goes through the framework's own ``parse_args`` and ``validate_args``.

What is parsed is what a user launches: args.txt plus launch.sbatch's SITE_ARGS (as bash expands them), with the
world size the layout needs in WORLD_SIZE and the environment launch.sbatch exports. Megatron-LM's sets are the
emit contract's: the Megatron-LM cases of tests/test_emit_cases.py and tests/test_emit_parallel.py (dense GQA, VPP,
uneven PP, CP 16, EP/ETP with --moe-grouped-gemm, MLA, FP8), the best `plan` survivors of tests/test_rulebook.py's
models, and the issue-14 targets (Llama-3.1-405B at 128K on 16,384 H100s, Mixtral-8x22B and DeepSeek-V3 in FP8 on
1,024/2,048 H100s). Each Megatron-DeepSpeed fork gets its emit cases and the rulebook models' best survivors.

Where the parsers come from. Megatron-LM's: the megatron-core wheel on PyPI ships ``megatron/training`` from 0.17.0
on (0.2.0 to 0.16.1, wheels and sdists, ship ``megatron/core`` only). 0.17.x declares Python >= 3.12, yet its
parse/validate path imports and runs on 3.11 (0.18.0 and later import ``typing.override``, Python >= 3.12); the
import chain needs ``triton``, whose PyPI wheel installs and imports on a CPU-only x86_64 machine; transformer-engine
and apex are not imported. .ci/run installs ``megatron-core==0.17.1 triton==3.9.0`` with ``--no-deps
--ignore-requires-python --target build/megatron-lm`` (torch, numpy, packaging and pyyaml come from ``.[test]``)
and names that folder in ``MEGATRON_LM_SRC``; an installed megatron-core >= 0.17 is found without it, and a
Megatron-LM git checkout works as well (tags core_v0.16.1 and core_v0.17.1 checked). The Megatron-DeepSpeed forks
are on no package index, so each runs from a checkout:
- ``MEGATRON_DEEPSPEED_MICROSOFT_SRC``: deepspeedai/Megatron-DeepSpeed with ``deepspeed`` (PyPI, ``DS_BUILD_OPS=0``,
  CPU accelerator) and ``transformers`` importable;
- ``MEGATRON_DEEPSPEED_BIGSCIENCE_SRC``: bigscience-workshop/Megatron-DeepSpeed with the DeepSpeed it runs with
  (``deepspeed>=0.7.3,<0.9``, which imports only with ``pydantic<2`` and ``numpy<2``) and ``transformers``; this
  fork validates inside ``parse_args``.
``<PREFIX>_PYTHON`` names another interpreter for a target (default: this one); the driver,
tests/test_megatron_parser_driver.py, needs no pytest there.
Without a checkout the parser tests skip, saying so; the fast tests below still pin what the sets cover.

Megatron-LM's ``validate_args`` asks the GPU for its compute capability (grouped GEMM needs >= 8.0; TP or CP before
10.0 need CUDA_DEVICE_MAX_CONNECTIONS=1). On a CPU machine the driver answers those two torch.cuda queries with the
planned GPU's capability (NVIDIA's CUDA GPU table, developer.nvidia.com/cuda-gpus: A100 8.0, H100/H200 9.0,
B200 10.0); nothing of Megatron or its dependencies is replaced. DeepSpeed picks its CPU accelerator there, so the
microsoft fork's CUDA-only CUDA_DEVICE_MAX_CONNECTIONS check does not run. Megatron-LM's
``core_transformer_config_from_args`` is not run: it needs transformer-engine (RoPE fusion, FP8, MLA checks),
which has no CPU build.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

DRIVER = Path(__file__).with_name("test_megatron_parser_driver.py")
"""run in the framework's interpreter (needs no pytest there)"""
COMPUTE_CAPABILITY = {"A100": (8, 0), "H100": (9, 0), "H200": (9, 0), "B200": (10, 0)}
"""NVIDIA CUDA GPUs table (developer.nvidia.com/cuda-gpus): compute capability by accelerator family."""
SURVIVORS_PER_PLAN = 6
"""best `plan` survivors parsed per model (each plan's top layouts differ in TP/PP/VPP/CP/EP/MBS)"""
# Issue 14's done-criterion layouts: (preset, H100s, sequence, global batch, precision).
ISSUE_TARGETS = [("llama3.1-405b", 16384, 131072, 128, "bf16"), ("mixtral-8x22b", 1024, 8192, 1024, "fp8"),
                 ("deepseek-v3", 2048, 4096, 4096, "fp8"), ("qwen3-30b-a3b", 64, 4096, 512, "bf16")]
GROUPS = ["emit-cases", "emit-parallel", "rulebook-survivors", "issue14-targets", "hf-configs"]
HF_CONFIGS = Path(__file__).parent / "fixtures" / "hf_configs"
"""published config.json files (tests/test_hf_configs.py): each target's set for every one it can express"""


@dataclass(frozen=True)
class ArgSet:
    group: str
    id: str
    argv: tuple[str, ...]
    world: int
    env: dict = field(hash=False)
    capability: tuple[int, int]
    vocab: int
    """the tokenizer's vocabulary (the model's), padded by the framework's tokenizer code"""
    expect: dict = field(hash=False)
    """parsed attribute -> value Megatron must end up with (degrees, MoE, FP8)"""


def _capability(setup) -> tuple[int, int]:
    gpu = setup.cluster.gpu.id
    return next(cap for family, cap in COMPUTE_CAPABILITY.items() if gpu.startswith(family))


def arg_set(group: str, case_id: str, setup, kind: str = "megatron-lm", flavor: str = "bigscience") -> ArgSet:
    """What `plan --emit <kind>` writes for ``setup``, as the launcher hands it to pretrain_gpt.py."""
    from planner.emit import render
    from test_emit_argnames import _sbatch_site_args

    files = render(setup, kind, flavor=flavor)
    argv = [tok for line in files["args.txt"].splitlines() for tok in line.split()]
    argv += [tok for arg in _sbatch_site_args(files["launch.sbatch"]) for tok in arg]
    env = dict(re.findall(r"^export ([A-Z_]+)=(\S+)", files["launch.sbatch"], re.M))
    c, m = setup.candidate, setup.model
    expect = {"tensor_model_parallel_size": c.tp, "pipeline_model_parallel_size": c.pp, "data_parallel_size": c.dp,
              "micro_batch_size": c.mbs, "global_batch_size": setup.training.global_batch, "num_layers": m.layers}
    if kind == "megatron-lm":
        expect |= {"context_parallel_size": c.cp, "expert_model_parallel_size": c.ep if m.num_experts else 1,
                   "num_experts": m.num_experts or None,
                   "fp8": "hybrid" if setup.training.precision == "fp8" else None,
                   "virtual_pipeline_model_parallel_size": c.vpp if c.vpp > 1 else None}
    if kind == "megatron-lm" and m.kv_lora_rank:   # MLA with the RMSNorms on its q/kv latents (issue 31)
        expect |= {"multi_latent_attention": True, "qk_layernorm": True}
    if kind == "megatron-lm" and setup.training.optimizer_offload:   # the layout's own folded in (RunSetup)
        expect |= {"optimizer_cpu_offload": True, "optimizer_offload_fraction": setup.training.optimizer_offload,
                   "use_precision_aware_optimizer": True, "overlap_cpu_optimizer_d2h_h2d": True}
    if kind == "megatron-lm" and setup.training.activation_offload:   # the layout's own folded in (RunSetup)
        expect |= {"fine_grained_activation_offloading": True,
                   "offload_modules": list(setup.training.activation_offload)}
    if kind == "megatron-lm" and setup.training.optimizer_state_dtype != "fp32":   # Adam's moments (BF16: DeepSeek-V3)
        expect |= {"use_precision_aware_optimizer": True}
    if kind == "megatron-lm" and c.zero >= 2:   # Megatron-FSDP
        expect |= {"use_megatron_fsdp": True,
                   "data_parallel_sharding_strategy": {2: "optim_grads", 3: "optim_grads_params"}[c.zero]}
    if kind == "megatron-lm" or flavor == "microsoft":   # the bigscience fork has no sequence parallelism
        expect["sequence_parallel"] = c.sp and c.tp > 1
    expect["padded_vocab_size"] = expected_padded_vocab(argv, m.vocab, c.tp)
    return ArgSet(group, case_id, tuple(argv), c.world, env, _capability(setup), m.vocab, expect)


def expected_padded_vocab(argv: list[str], vocab: int, tp: int) -> int:
    """The embedding's rows plantune asked for: --pad-vocab-size-to (BigScience fork), else the vocabulary rounded up
    to a multiple of --make-vocab-size-divisible-by (default 128) x TP, Megatron's rule (the driver's docstring)."""
    if "--pad-vocab-size-to" in argv:
        return int(argv[argv.index("--pad-vocab-size-to") + 1])
    divisor = int(argv[argv.index("--make-vocab-size-divisible-by") + 1]) if "--make-vocab-size-divisible-by" in argv \
        else 128
    return -(-vocab // (divisor * tp)) * divisor * tp


def _survivors(group: str, name: str, model, cluster, training, kind: str, flavor: str) -> list[ArgSet]:
    from planner.emit import RunSetup
    from planner.rank import plan
    from planner.rules import Target

    target = Target(kind, flavor if kind == "megatron-deepspeed" else None)
    p = plan(model, cluster, training, targets=(target,), allow_empty=True)
    return [arg_set(group, f"{name}:{e.candidate.label()}",
                    RunSetup(model=p.model, cluster=cluster, training=training, candidate=e.candidate), kind, flavor)
            for e in p.candidates[:SURVIVORS_PER_PLAN]]


@functools.lru_cache(maxsize=1)
def all_arg_sets() -> tuple[ArgSet, ...]:
    """Megatron-LM's sets (groups GROUPS)."""
    from planner.hardware import make_cluster
    from planner.model import get_preset
    from planner.rules import Target, model_violations
    from planner.space import TrainingSpec
    from test_emit_cases import VALID_CASES, llama
    from test_emit_parallel import CASES
    from test_rulebook import MODELS, _training

    sets = [arg_set("emit-cases", c.id, c.setup) for c in VALID_CASES if c.kind == "megatron-lm"]
    sets.append(arg_set("emit-cases", "llama3-405b-uneven-pp",
                        llama("llama3-405b", gpus=2048, tp=8, pp=16, dp=16, gas=64, recompute="full")))
    sets += [arg_set("emit-parallel", name, setup) for name, setup in CASES.items()]
    target = Target("megatron-lm")
    for name, (model, gpus, gpu, gbs, seq) in MODELS.items():
        cluster, training = make_cluster(gpu=gpu, gpus=gpus), _training(target, gbs, seq, model)
        if not model_violations(model, training, cluster, target):
            sets += _survivors("rulebook-survivors", name, model, cluster, training, "megatron-lm", "bigscience")
    for name, gpus, seq, gbs, precision in ISSUE_TARGETS:
        training = TrainingSpec(global_batch=gbs, seq_len=seq, framework="megatron-lm", precision=precision,
                                zero_options=(1,), recompute_options=("selective", "full"))
        sets += _survivors("issue14-targets", name, get_preset(name), make_cluster(gpu="H100", gpus=gpus), training,
                           "megatron-lm", "bigscience")
    return tuple(sets) + hf_config_sets("megatron-lm", "bigscience")


def hf_config_sets(kind: str, flavor: str) -> tuple[ArgSet, ...]:
    """The published config.json files' sets that ``kind`` can express (tests/test_hf_configs.py's layouts)."""
    from planner.errors import InputError
    from test_hf_configs import QWEN25_TOKENIZER, _load, _setup

    sets = []
    for path in sorted(HF_CONFIGS.glob("*.json")):
        setup = _setup(_load(path.name)[1], kind)
        try:
            sets.append(arg_set("hf-configs", path.stem, setup, kind, flavor))
        except InputError:   # refused in one line: tests/test_hf_configs.py checks why
            continue
        if path.stem.startswith("Qwen2.5"):   # its tokenizer's 151,665 tokens reach the file's 152,064 rows (issue 31)
            s = sets[-1]
            sets.append(replace(s, id=f"{s.id}:tokenizer", vocab=QWEN25_TOKENIZER))
    return tuple(sets)


@functools.lru_cache(maxsize=2)
def fork_arg_sets(flavor: str) -> tuple[ArgSet, ...]:
    """A Megatron-DeepSpeed fork's sets: its emit cases and the rulebook models' best survivors."""
    from planner.hardware import make_cluster
    from planner.rules import Target, model_violations
    from test_emit_cases import VALID_CASES
    from test_rulebook import MODELS, _training

    sets = [arg_set("cases", c.id, c.setup, c.kind, c.flavor) for c in VALID_CASES
            if c.kind == "megatron-deepspeed" and c.flavor == flavor]
    target = Target("megatron-deepspeed", flavor)
    for name, (model, gpus, gpu, gbs, seq) in MODELS.items():
        cluster, training = make_cluster(gpu=gpu, gpus=gpus), _training(target, gbs, seq, model)
        if not model_violations(model, training, cluster, target):
            sets += _survivors("survivors", name, model, cluster, training, "megatron-deepspeed", flavor)
    return tuple(sets) + hf_config_sets("megatron-deepspeed", flavor)


SOURCES = {  # target -> (environment variable prefix, the parser's module, the argument sets)
    "megatron-lm": ("MEGATRON_LM", "megatron/training/arguments.py", all_arg_sets),
    "microsoft": ("MEGATRON_DEEPSPEED_MICROSOFT", "megatron/arguments.py", lambda: fork_arg_sets("microsoft")),
    "bigscience": ("MEGATRON_DEEPSPEED_BIGSCIENCE", "megatron/arguments.py", lambda: fork_arg_sets("bigscience")),
}


# ---- fast: what the parser run covers, and the launch environment rule it found --------------------------------

def test_the_parsed_sets_cover_every_emitted_feature():
    """The parser test is only as good as its sets: each Megatron-LM feature plantune emits is in at least one."""
    flags = {tok for s in all_arg_sets() for tok in s.argv if tok.startswith("--")}
    assert {"--group-query-attention", "--num-virtual-stages-per-pipeline-rank", "--decoder-first-pipeline-num-layers",
            "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
            "--context-parallel-size", "--cp-comm-type", "--expert-model-parallel-size",
            "--expert-tensor-parallel-size", "--num-experts", "--moe-grouped-gemm", "--moe-layer-freq",
            "--moe-shared-expert-intermediate-size", "--moe-expert-capacity-factor", "--multi-latent-attention",
            "--q-lora-rank", "--kv-channels", "--fp8-format", "--fp8-recipe", "--use-rope-scaling",
            "--rampup-batch-size", "--sequence-parallel", "--use-distributed-optimizer",
            "--recompute-granularity", "--recompute-method", "--train-samples", "--use-megatron-fsdp",
            "--data-parallel-sharding-strategy", "--pipeline-model-parallel-layout", "--mtp-num-layers",
            "--recompute-modules", "--optimizer-cpu-offload", "--optimizer-offload-fraction",
            "--overlap-moe-expert-parallel-comm", "--moe-flex-dispatcher-backend",
            "--fine-grained-activation-offloading", "--offload-modules"} <= flags
    assert {s.group for s in all_arg_sets()} == set(GROUPS)
    assert len(all_arg_sets()) >= 40
    hf = {tok for s in all_arg_sets() if s.group == "hf-configs" for tok in s.argv if tok.startswith("--")}
    assert {"--norm-epsilon", "--add-qkv-bias", "--qk-layernorm", "--moe-aux-loss-coeff", "--moe-router-score-function",
            "--moe-router-enable-expert-bias", "--moe-router-num-groups", "--rotary-scaling-factor",
            "--use-rope-scaling"} <= hf


def test_every_set_names_the_padded_vocabulary_its_tokenizer_must_reach():
    """The BigScience fork's _vocab_size_with_padding raises unless --pad-vocab-size-to is a multiple of
    --make-vocab-size-divisible-by (128); the embedding is split over TP. The slow run below computes it with each
    framework's own function; this checks the sets ask for a size those rules allow."""
    for s in [*all_arg_sets(), *fork_arg_sets("bigscience"), *fork_arg_sets("microsoft")]:
        padded, tp = s.expect["padded_vocab_size"], s.expect["tensor_model_parallel_size"]
        assert padded >= s.vocab and padded % tp == 0, s.id
        if "--pad-vocab-size-to" in s.argv:
            assert padded % 128 == 0, s.id


def test_tp_or_cp_launches_with_one_cuda_connection():
    """Megatron-LM's validate_args (megatron/training/arguments.py at core_v0.16.1 and core_v0.17.1) asserts
    CUDA_DEVICE_MAX_CONNECTIONS == "1" whenever TP > 1 or CP > 1 on GPUs before Blackwell; found by the parser run
    below (plantune exported it only with --sequence-parallel)."""
    seen = 0
    for s in all_arg_sets():
        needs = s.expect["tensor_model_parallel_size"] > 1 or s.expect["context_parallel_size"] > 1
        # Megatron-FSDP asserts the opposite (CUDA_DEVICE_MAX_CONNECTIONS != "1"; with TP/CP only a warning)
        fsdp = s.expect.get("use_megatron_fsdp", False)
        assert (s.env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1") == (
            (needs or s.expect["sequence_parallel"]) and not fsdp), s.id
        seen += needs and not s.expect["sequence_parallel"]
    assert seen > 0   # a TP or CP layout without SP is among the sets


# ---- slow: the frameworks' own parsers -------------------------------------------------------------------------

def _installed(module: str) -> str | None:
    """The site folder of an installed ``megatron`` package holding ``module`` (megatron-core >= 0.17.0 wheels
    ship megatron/training), found without importing it."""
    spec = importlib.util.find_spec("megatron")
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location).parent / module).is_file():
            return str(Path(location).parent)
    return None


def _source(target: str) -> str:
    prefix, module, _ = SOURCES[target]
    src = os.environ.get(f"{prefix}_SRC") or (_installed(module) if target == "megatron-lm" else None)
    if not src:
        pytest.skip(f"{prefix}_SRC is not set and no installed package holds {module}: see this module's docstring")
    if not (Path(src) / module).is_file():
        pytest.fail(f"{prefix}_SRC={src} holds no {module}")
    return src


@functools.lru_cache(maxsize=None)
def _parsed(target: str) -> dict[str, dict]:
    """One interpreter imports the framework once and parses every set: {set id: driver result}."""
    src = _source(target)
    prefix, _, sets = SOURCES[target]
    payload = json.dumps([{"id": s.id, "argv": s.argv, "world": s.world, "env": s.env, "capability": s.capability,
                           "attrs": sorted(s.expect), "vocab": s.vocab} for s in sets()])
    env = {**os.environ, "PYTHONPATH": src, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([os.environ.get(f"{prefix}_PYTHON", sys.executable), str(DRIVER)], input=payload,
                          capture_output=True, text=True, env=env, cwd=src)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["id"]: r for r in results}


def _problems(target: str, group: str) -> list[str]:
    sets = [s for s in SOURCES[target][2]() if s.group == group]
    assert sets
    parsed, problems = _parsed(target), []
    for s in sets:
        r = parsed[s.id]
        if r["stage"] != "ok":
            problems.append(f"{s.id}: {r['stage']}: {r['error']}")
            continue
        wrong = {k: (r["attrs"][k], v) for k, v in s.expect.items() if r["attrs"][k] != v}
        if wrong:
            problems.append(f"{s.id}: parsed (got, want) {wrong}")
    return problems


@pytest.mark.slow
@pytest.mark.xdist_group("megatron-lm-parser")   # one worker: Megatron-LM imported and every set parsed once (_parsed)
@pytest.mark.parametrize("group", GROUPS)
def test_megatron_lm_parses_and_validates_the_emitted_arguments(group):
    assert _problems("megatron-lm", group) == []


@pytest.mark.slow
@pytest.mark.xdist_group("megatron-deepspeed-parser")
# of the published config.json files the bigscience fork expresses GPT-2 alone (the rest are RMSNorm models)
@pytest.mark.parametrize("flavor,group", [("microsoft", "cases"), ("microsoft", "survivors"),
                                          ("microsoft", "hf-configs"), ("bigscience", "cases"),
                                          ("bigscience", "survivors"), ("bigscience", "hf-configs")])
def test_megatron_deepspeed_parses_and_validates_the_emitted_arguments(flavor, group):
    assert _problems(flavor, group) == []


@pytest.mark.slow
def test_the_gpu_sessions_megatron_commands_parse(tmp_path):
    """tests/bench/megatron_gpu.sh runs NVIDIA's pretrain_gpt.py with what bench_megatron.py renders (probe variant,
    --transformer-impl local, mock data): Megatron-LM's own parser accepts each command before a GPU is spent on it.
    MEGATRON_LM_RUN_SRC: a Megatron-LM tree with pretrain_gpt.py (default build/megatron-lm-v0.17.1)."""
    root = Path(__file__).resolve().parents[1]
    src = Path(os.environ.get("MEGATRON_LM_RUN_SRC", root / "build" / "megatron-lm-v0.17.1"))
    if not (src / "pretrain_gpt.py").is_file():
        pytest.skip(f"no Megatron-LM tree with pretrain_gpt.py at {src}: see tests/bench/megatron_gpu.sh")
    proc = subprocess.run([sys.executable, str(root / "tests" / "bench" / "bench_megatron.py"), "--megatron-src",
                           str(src), "--check-args"], capture_output=True, text=True, cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.count(" ok ") == 4
