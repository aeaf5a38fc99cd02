"""plantune's analytic planner: enumerate, prune with reasons, predict memory and TFLOPs, rank.

    >>> import planner
    >>> p = planner.plan(planner.load_model("176B"), planner.make_cluster(gpu="A100-80GB", gpus=384),
    ...                  planner.TrainingSpec(global_batch=2048, seq_len=2048))
    >>> best = p.candidates[0]          # an Estimate: .candidate, .memory, .time, .throughput

Pure Python: never imports torch (tests/test_planner_api.py proves it).
"""

import gc

from planner.files import dataclass_code_cache

# The cyclic garbage collector paused while the package is imported: the import allocates ~11,000 objects (classes,
# functions, the catalog and presets) that live as long as the process, and the collections they trigger walk them
# again and again as they age (~20 collections, 3-5 ms of `plan`'s start-up). After, they are moved straight into
# the oldest generation (gc.freeze then gc.unfreeze: a list splice, no walk; the importer's own young objects go with
# them), which only a full collection walks, and the collector is back on if it was. Nothing is kept that would be
# freed: a cycle among them waits for the next full collection instead of a young one.
_gc_was_enabled = gc.isenabled()
gc.disable()
try:
    with dataclass_code_cache():   # the specs' dataclass methods compiled once, kept beside the bytecode
        from planner.cost import CostParams
        from planner.errors import DoesNotFitError, InputError, PlantuneError
        from planner.hardware import CATALOG, Accelerator, ClusterSpec, get_accelerator, load_cluster, make_cluster
        from planner.model import PRESETS, ModelSpec, Rampup, get_preset, load_model
        from planner.rank import Estimate, Plan, estimate, plan
        from planner.space import Candidate, TrainingSpec
        import planner.rampup_schedule   # noqa: F401 - `plan`'s rampup table: its classes compiled under the cache too
finally:
    gc.freeze()
    gc.unfreeze()
    if _gc_was_enabled:
        gc.enable()
    del _gc_was_enabled


__all__ = ["CATALOG", "Accelerator", "Candidate", "ClusterSpec", "CostParams", "DoesNotFitError", "Estimate",
           "InputError", "ModelSpec", "PRESETS", "Plan", "PlantuneError", "Rampup", "TrainingSpec", "estimate",
           "get_accelerator", "get_preset", "load_cluster", "load_model", "make_cluster", "plan"]
