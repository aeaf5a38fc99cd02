"""Emitters: a chosen plan as the files a framework runs.

``emit(setup, kind, out_dir)`` writes, for ``kind``:

- ``megatron-deepspeed``: plan.yaml, ds_config.json, args.txt, megatron_args.sh, launch.sbatch
  (``flavor`` "bigscience" or "microsoft" picks the fork's spelling);
- ``megatron-lm``: plan.yaml, args.txt, megatron_args.sh, launch.sbatch (NVIDIA/Megatron-LM's pretrain_gpt.py);
- ``fsdp``: plan.yaml, launch_torchtitan.sh and, for torchtitan 0.3.0 (default), plantune_torchtitan.py (its
  config function) or, with ``torchtitan_version="0.2.2"``, torchtitan.toml (+ plantune_model.py).

Rules live in :mod:`planner.rules` (asked through `setup_problems`); a setup that breaks one is refused
before anything is written.
"""

from planner.emit.plan_yaml import load_plan_yaml, plan_target, plan_yaml_dict
from planner.emit.setup import FLAVORS, KINDS, Prediction, RunSetup, setup_problems
from planner.emit.write import emit, render

__all__ = ["FLAVORS", "KINDS", "Prediction", "RunSetup", "emit", "load_plan_yaml", "plan_target", "plan_yaml_dict",
           "render", "setup_problems"]
