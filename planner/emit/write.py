"""`emit`: check a RunSetup against every rule of the target, render all files in memory, then write.

    >>> from planner.emit import emit
    >>> # emit(setup, "megatron-deepspeed", Path("out"), flavor="bigscience", reservation="bigscience")

A setup that breaks a rule raises InputError (one line, every problem and its fix) before anything
is written; files are written only when every one of them rendered.
"""

from __future__ import annotations

from pathlib import Path

from planner.emit import fsdp, megatron_deepspeed as md, megatron_lm, sbatch, torchtitan_py
from planner.emit.facts import vocab_note
from planner.emit.plan_yaml import plan_yaml_text
from planner.emit.setup import RunSetup, one_line, setup_problems
from planner.errors import InputError
from planner.files import write_files
from planner.framework import TORCHTITAN_VERSIONS   # what ``fsdp`` writes for (re-exported)

PLAN_FILE = "plan.yaml"


def render(setup: RunSetup, kind: str, *, flavor: str = "bigscience",
           reservation: str | None = None, time_hours: int = sbatch.TIME_LIMIT_HOURS,
           torchtitan_version: str = TORCHTITAN_VERSIONS[0]) -> dict[str, str]:
    """File name -> content for this kind; InputError when the setup breaks any rule."""
    problems = setup_problems(setup, kind, flavor)
    if problems:
        target = f"{kind} ({flavor} fork)" if kind == "megatron-deepspeed" else kind
        raise InputError(f"cannot emit {target}: " + "; ".join(problems))
    sbatch.check_reservation(reservation)
    if kind == "megatron-deepspeed":
        args = md.megatron_args(setup, flavor)
        title = (f"Megatron-DeepSpeed ({flavor} fork) arguments for {one_line(setup.model.name)}, written by plantune."
                 f"\n# {vocab_note(setup.model, setup.candidate.tp, flavor)}")
        return {PLAN_FILE: plan_yaml_text(setup, kind=kind, flavor=flavor),
                md.DS_CONFIG_NAME: md.ds_config_text(setup, flavor),
                "args.txt": md.args_txt(args),
                "megatron_args.sh": md.megatron_args_sh(args, title),
                "launch.sbatch": sbatch.launch_sbatch(setup, flavor, reservation=reservation, time_hours=time_hours)}
    if kind == "megatron-lm":
        args = megatron_lm.megatron_lm_args(setup)
        title = (f"Megatron-LM arguments for {one_line(setup.model.name)}, written by plantune."
                 f"\n# {vocab_note(setup.model, setup.candidate.tp, 'megatron-lm')}")
        return {PLAN_FILE: plan_yaml_text(setup, kind=kind, flavor=None),
                "args.txt": md.args_txt(args),
                "megatron_args.sh": md.megatron_args_sh(args, title, ds_config=False),
                "launch.sbatch": sbatch.launch_sbatch(setup, "megatron-lm", reservation=reservation,
                                                      time_hours=time_hours)}
    if torchtitan_version not in TORCHTITAN_VERSIONS:
        raise InputError(f"torchtitan {torchtitan_version} has no writer: use --torchtitan-version "
                         + " or ".join(TORCHTITAN_VERSIONS))
    job = fsdp.files(setup) if torchtitan_version == fsdp.TORCHTITAN_VERSION else torchtitan_py.files(setup)
    return {PLAN_FILE: plan_yaml_text(setup, kind=kind, flavor=None), **job}


def emit(setup: RunSetup, kind: str, out_dir: Path, *, flavor: str = "bigscience",
         reservation: str | None = None, time_hours: int = sbatch.TIME_LIMIT_HOURS, force: bool = False,
         torchtitan_version: str = TORCHTITAN_VERSIONS[0]) -> list[Path]:
    """Write the files for ``kind`` ("megatron-deepspeed" | "megatron-lm" | "fsdp") into out_dir; a file already
    there (a user's edit) is replaced only with ``force`` (planner.files.write_files)."""
    files = render(setup, kind, flavor=flavor, reservation=reservation, time_hours=time_hours,
                   torchtitan_version=torchtitan_version)
    return write_files(Path(out_dir), files, force=force)


__all__ = ["PLAN_FILE", "TORCHTITAN_VERSIONS", "emit", "render"]
