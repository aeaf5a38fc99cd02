"""``launch.sbatch``: a SLURM batch script in the shape of BigScience's tr11-176B-ml.slurm.

For Megatron-DeepSpeed (either fork) and Megatron-LM alike: the arguments come from
megatron_args.sh (and ds_config.json for DeepSpeed); what differs per framework is the repository,
the tokenizer flags and the DeepSpeed version the script says it needs.

One task per node runs ``torch.distributed.run`` (``--nproc_per_node`` GPUs, c10d rendezvous on the
first host of the allocation, ``--node_rank $SLURM_PROCID``) under ``srun --wait=60
--kill-on-bad-exit=1``. Plantune's arguments come from megatron_args.sh and ds_config.json next to
the script; what plantune cannot know (data, tokenizer, checkpoints, the Megatron clone) must be set
in the environment, and the script stops with a message naming the variable when one is missing.
``PRETRAIN_SCRIPT`` and ``PYTHON`` override the entry point and interpreter (a test's stand-in).
"""

from __future__ import annotations

import re
import shlex

from planner.emit.megatron_deepspeed import DS_CONFIG_NAME
from planner.emit.setup import NO_BUDGET, RunSetup, one_line, train_samples
from planner.errors import InputError

MASTER_PORT = 6000
_SLURM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_REPOS = {"bigscience": "bigscience-workshop/Megatron-DeepSpeed", "microsoft": "deepspeedai/Megatron-DeepSpeed",
          "megatron-lm": "NVIDIA/Megatron-LM"}
_DEEPSPEED = {
    # deepspeed/__init__.py asserts since v0.9.0 (commit 47f9f13, 2023-04) that no config comes both in args and in
    # initialize(config=...); the bigscience fork passes both (megatron/training.py), the microsoft fork only the dict.
    "bigscience": "needs DeepSpeed >= 0.7.3 and < 0.9.0 (pip install 'deepspeed>=0.7.3,<0.9'): its "
                  "megatron/training.py gives deepspeed.initialize() the config twice, which DeepSpeed >= 0.9.0 "
                  "refuses at start-up",
    "microsoft": "works with current DeepSpeed (>= 0.9.0: it passes the config once, as a dict)",
    "megatron-lm": "no DeepSpeed; Megatron-LM with Megatron-Core and Transformer Engine (NVIDIA's PyTorch container)",
}
# Optimizer moments and weight decay as GPT-3 (App. B) and BLOOM-176B (tr11-176B-ml.slurm); the learning-rate
# schedule is the model's and the token budget's (planner.emit.facts), in megatron_args.sh.
_HYPER = ("--adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 --weight-decay 1e-1",)
_OUTPUT = "--log-interval 1 --save-interval 300 --eval-interval 1000 --eval-iters 5"
TIME_LIMIT_HOURS = 20
"""SLURM --time; Megatron saves and exits 10 minutes before it (--exit-duration-in-mins; tr11: 20 h -> 1190)"""
SITE_SETTINGS = [
    "# --- site settings: uncomment or set in the environment (plantune cannot know your fabric or container) ---",
    "# export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-ib0}   # the interface NCCL bootstraps on",
    "# export NCCL_IB_HCA=${NCCL_IB_HCA:-mlx5}                # the InfiniBand adapters NCCL uses",
    "# export NCCL_DEBUG=${NCCL_DEBUG:-WARN}                  # INFO shows the rings and the transport chosen",
    "# CONTAINER_IMAGE: an enroot/pyxis image to run in (e.g. nvcr.io/nvidia/pytorch:<tag>-py3), CONTAINER_MOUNTS its",
    "# mounts (this folder, the data and the checkpoints); both empty: no container",
    "CONTAINER_IMAGE=${CONTAINER_IMAGE:-}",
    "CONTAINER_MOUNTS=${CONTAINER_MOUNTS:-$PLAN_DIR:$PLAN_DIR}",
    "CONTAINER=()",
    'if [ -n "$CONTAINER_IMAGE" ]; then CONTAINER=(--container-image "$CONTAINER_IMAGE" '
    '--container-mounts "$CONTAINER_MOUNTS" --container-workdir "$PLAN_DIR"); fi',
    "# the one task per node gets the node's CPUs (torchrun and the data loaders): SLURM's count for this node",
    "CPUS_PER_TASK=${CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-1}}",
]
"""what a site sets around the launch, as commented or overridable variables (shared by every launcher); srun takes
--cpus-per-task from the allocation, as srun no longer inherits sbatch's (Slurm >= 22.05)"""


def tokenizer_line(setup: RunSetup) -> str:
    """TOKENIZER: the model's own Hugging Face repository when known (overridable), else a variable the launcher
    stops without."""
    hub = setup.model.hub_id
    if hub:
        return f"TOKENIZER=${{TOKENIZER:-{hub}}}   # {one_line(setup.model.name)}'s own tokenizer (its Hugging Face id)"
    return ("TOKENIZER=${TOKENIZER:?set TOKENIZER to the Hugging Face tokenizer of the model: its repository id or a "
            "local folder}")


def check_reservation(reservation: str | None) -> None:
    if reservation is not None and not _SLURM_NAME.match(reservation):
        raise InputError(f"reservation {reservation!r} is not a SLURM name; use letters, digits, '.', '_' or '-'")


def _job_name(setup: RunSetup) -> str:
    return "plantune-" + (re.sub(r"[^A-Za-z0-9._-]+", "-", setup.model.name).strip("-") or "model")


def _summary(setup: RunSetup, flavor: str) -> list[str]:
    c, t, cl = setup.candidate, setup.training, setup.cluster
    name = one_line(setup.model.name)
    what = f"Megatron-LM ({_REPOS[flavor]})" if flavor == "megatron-lm" else \
        f"Megatron-DeepSpeed ({flavor} fork, {_REPOS[flavor]})"
    lines = [f"{what} run of {name} on "
             f"{cl.nodes} x {cl.gpus_per_node} {cl.gpu.id}, written by plantune.",
             f"This fork {_DEEPSPEED[flavor]}." if flavor != "megatron-lm" else f"Runs with {_DEEPSPEED[flavor]}.",
             f"Layout: TP={c.tp} PP={c.pp} DP={c.dp}, MBS={c.mbs} GBS={t.global_batch} (GAS {c.gas}), "
             f"recompute {c.recompute}, ZeRO {c.zero}, {t.precision}"
             + (f", rampup {' '.join(map(str, t.rampup.as_list()))}" if t.rampup else "") + "."]
    if setup.prediction:
        p = setup.prediction
        lines.append(f"Predicted: {p.step_time_s:.2f} s/step, {p.memory_gb_per_gpu:.1f} GB/GPU (GB = 1e9 B), "
                     f"{p.model_tflops_per_gpu:.1f} model TFLOP/s/GPU (MFU {p.mfu:.2f}).")
    return lines


def _deepspeed_guard(flavor: str) -> list[str]:
    """The bigscience fork stops at deepspeed.initialize() under DeepSpeed >= 0.9.0: check before the allocation
    is spent starting every node."""
    if flavor != "bigscience":
        return []
    fix = "pip install 'deepspeed>=0.7.3,<0.9'"
    return ["# the bigscience fork needs DeepSpeed < 0.9.0 (see the top): stop here rather than in every rank",
            "\"$PYTHON\" - <<'PY' || exit 1",
            "import sys",
            "try:",
            "    import deepspeed",
            "except ImportError:",
            f"    sys.exit(\"launch.sbatch: DeepSpeed is not installed; {fix}\")",
            "major, minor = (int(''.join(c for c in x if c.isdigit()) or 0) for x in deepspeed.__version__.split('.')[:2])",
            "if (major, minor) >= (0, 9):",
            f"    sys.exit(f\"launch.sbatch: DeepSpeed {{deepspeed.__version__}} refuses the bigscience fork's double "
            f"config (deepspeed.initialize); {fix}\")",
            "PY",
            ""]


def launch_sbatch(setup: RunSetup, flavor: str, *, reservation: str | None = None,
                  time_hours: int = TIME_LIMIT_HOURS) -> str:
    """``flavor``: "bigscience" | "microsoft" (Megatron-DeepSpeed forks) or "megatron-lm"."""
    check_reservation(reservation)
    if not isinstance(time_hours, int) or time_hours < 1:
        raise InputError(f"--time-limit {time_hours!r}: give whole hours >= 1")
    cl = setup.cluster
    q = shlex.quote
    directives = [f"--job-name={_job_name(setup)}", f"--nodes={cl.nodes}",
                  "--ntasks-per-node=1          # one torch.distributed.run per node, it starts the GPU ranks",
                  f"--time={time_hours}:00:00", f"--gres=gpu:{cl.gpus_per_node}", "--exclusive",
                  "--output=%x-%j.out"]
    if reservation:
        directives.append(f"--reservation={reservation}")
    tokenizer = {"bigscience": "--tokenizer-type PretrainedFromHF --tokenizer-name-or-path \"$TOKENIZER\"",
                 "microsoft": "--tokenizer-type HFTokenizer --tokenizer-model \"$TOKENIZER\"",
                 "megatron-lm": "--tokenizer-type HuggingFaceTokenizer --tokenizer-model \"$TOKENIZER\""}[flavor]
    needs_samples = train_samples(setup.training) is None
    env = [
        "DATA_PATH=${DATA_PATH:?set DATA_PATH to your dataset tokenized with the tokenizer of this model by the "
        "Megatron tools/preprocess_data.py (the .bin/.idx prefix)}",
        tokenizer_line(setup),
        "CHECKPOINT_PATH=${CHECKPOINT_PATH:?set CHECKPOINT_PATH to the folder checkpoints are saved to "
        "and resumed from}",
        f'PRETRAIN_SCRIPT=${{PRETRAIN_SCRIPT:-${{MEGATRON_DIR:?set MEGATRON_DIR to a clone of {_REPOS[flavor]} '
        '(or PRETRAIN_SCRIPT to an absolute path)}/pretrain_gpt.py}',
    ]
    if needs_samples:
        env.append(f"TRAIN_SAMPLES=${{TRAIN_SAMPLES:?set TRAIN_SAMPLES to the sequences to train: {NO_BUDGET}}}")
    site = ['--data-path "$DATA_PATH" --split 949,50,1', tokenizer,
            '--save "$CHECKPOINT_PATH" --load "$CHECKPOINT_PATH" --tensorboard-dir "$CHECKPOINT_PATH/tensorboard"',
            *_HYPER, _OUTPUT, f"--exit-duration-in-mins {time_hours * 60 - 10}"]
    if needs_samples:
        site.append('--train-samples "$TRAIN_SAMPLES"')
    c = setup.candidate
    # Megatron-LM's validate_args (megatron/training/arguments.py, core_v0.16.1 to main d98e8a6) asserts it for
    # TP > 1 or CP > 1 (before Blackwell); the forks ask for it with --sequence-parallel only.
    needs_max_connections = c.sp or (flavor == "megatron-lm" and (c.tp > 1 or c.cp > 1))
    if flavor == "megatron-lm" and c.zero >= 2:
        # Megatron-FSDP: validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS != "1" (with TP/CP only a warning)
        needs_max_connections = False
    exports = ["export CUDA_DEVICE_MAX_CONNECTIONS=1   # Megatron refuses TP/CP/--sequence-parallel without it"] \
        if needs_max_connections else []
    if flavor == "megatron-lm" and setup.training.activation_offload:
        # validate_args (megatron/training/arguments.py): with Transformer Engine >= 2.10 it asserts
        # NVTE_CPU_OFFLOAD_V1=1 under --fine-grained-activation-offloading ("to avoid offloading weights")
        exports.append("export NVTE_CPU_OFFLOAD_V1=1   # Megatron asks it of --fine-grained-activation-offloading")
    world = setup.candidate.world
    text = "\n".join([
        "#!/bin/bash",
        *(f"# {line}" for line in _summary(setup, flavor)),
        "# Submit from this folder (it holds megatron_args.sh" + (" and ds_config.json" if flavor != "megatron-lm" else "")
        + "), with the placeholders set:",
        "#   DATA_PATH=... " + ("" if setup.model.hub_id else "TOKENIZER=... ")
        + "CHECKPOINT_PATH=... MEGATRON_DIR=... sbatch launch.sbatch",
        *(f"#SBATCH {d}" for d in directives),
        "",
        "set -eu -o pipefail",
        "",
        "# --- what plantune cannot know: set these in the environment ---",
        *env,
        'PLAN_DIR=${PLAN_DIR:-${SLURM_SUBMIT_DIR:-$PWD}}',
        "PYTHON=${PYTHON:-python}",
        "",
        f"if [ \"${{SLURM_NNODES:-0}}\" != {cl.nodes} ]; then",
        f"    echo \"launch.sbatch: planned for {cl.nodes} nodes x {cl.gpus_per_node} GPUs (TP*PP*DP = {world}), "
        "got SLURM_NNODES=${SLURM_NNODES:-unset}\" >&2",
        "    exit 1",
        "fi",
        "",
        f"GPUS_PER_NODE={cl.gpus_per_node}",
        "NNODES=$SLURM_NNODES",
        'HOSTS=$(scontrol show hostnames "$SLURM_JOB_NODELIST")  # no pipe: head would SIGPIPE scontrol under pipefail',
        'MASTER_ADDR=${HOSTS%%$\'\\n\'*}',
        f"MASTER_PORT={MASTER_PORT}",
        "export PYTHON GPUS_PER_NODE NNODES MASTER_ADDR MASTER_PORT",
        *exports,
        "",
        *SITE_SETTINGS,
        "",
        f"cd \"$PLAN_DIR\"   # {DS_CONFIG_NAME} is given relative to this folder" if flavor != "megatron-lm"
        else "cd \"$PLAN_DIR\"",
        *_deepspeed_guard(flavor),
        "# shellcheck source=megatron_args.sh",
        "source ./megatron_args.sh",
        "# not plantune's to choose: data, tokenizer, checkpoints, logging (edit)",
        "SITE_ARGS=(",
        *(f"    {s}" for s in site),
        ")",
        "",
        "# one task per node; each runs torch.distributed.run with its node rank (evaluated on that node)",
        # ${CONTAINER[@]+...}: nothing when empty, also under set -u in bash < 4.4
        'srun --wait=60 --kill-on-bad-exit=1 --cpus-per-task="$CPUS_PER_TASK" ${CONTAINER[@]+"${CONTAINER[@]}"} '
        "bash -c "
        + q('exec "$PYTHON" -u -m torch.distributed.run --nproc_per_node "$GPUS_PER_NODE" --nnodes "$NNODES" '
            '--rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv_backend c10d --max_restarts 0 --tee 3 '
            '--node_rank "$SLURM_PROCID" "$@"')
        + ' torchrun "$PRETRAIN_SCRIPT" "${MEGATRON_ARGS[@]}" "${SITE_ARGS[@]}"',
        "",
    ])
    return text


__all__ = ["MASTER_PORT", "SITE_SETTINGS", "check_reservation", "launch_sbatch", "tokenizer_line"]
