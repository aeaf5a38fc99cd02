"""plantune's analytic planner: enumerate, prune with reasons, predict memory and TFLOPs, rank.

    >>> import planner
    >>> p = planner.plan(planner.load_model("176B"), planner.make_cluster(gpu="A100-80GB", gpus=384),
    ...                  planner.TrainingSpec(global_batch=2048, seq_len=2048))
    >>> best = p.candidates[0]          # an Estimate: .candidate, .memory, .time, .throughput

Pure Python: never imports torch (tests/test_planner_api.py proves it).
"""

from planner.files import dataclass_code_cache

with dataclass_code_cache():   # the specs' dataclass methods compiled once, kept beside the bytecode
    from planner.cost import CostParams
    from planner.errors import DoesNotFitError, InputError, PlantuneError
    from planner.hardware import CATALOG, Accelerator, ClusterSpec, get_accelerator, load_cluster, make_cluster
    from planner.model import PRESETS, ModelSpec, Rampup, get_preset, load_model
    from planner.rank import Estimate, Plan, estimate, plan
    from planner.space import Candidate, TrainingSpec


__all__ = ["CATALOG", "Accelerator", "Candidate", "ClusterSpec", "CostParams", "DoesNotFitError", "Estimate",
           "InputError", "ModelSpec", "PRESETS", "Plan", "PlantuneError", "Rampup", "TrainingSpec", "estimate",
           "get_accelerator", "get_preset", "load_cluster", "load_model", "make_cluster", "plan"]
