"""Issue 33's last criterion, measured: are the planner's MoE predictions as good as its dense ones on the dev data?

    PYTHONPATH=$PWD python3 tests/bench/moe_vs_dense.py

Every run of the dev data that a validation script scores on its own (predicted / published throughput of one run,
not a ratio of two), grouped by whether the model has routed experts (planner.model.is_moe):
- tests/bench/validate_moe_cp.py: all its rows (Llama 3 Table 4, Megatron-Bridge 25.11 H100 / B200, DeepSeek-V3's
  own H800 run), each as that script scores it (`validate_moe_cp.score`);
- tests/bench/validate_blackwell.py: the NeMo 25.04/25.07 DGX-GB200 rows of published_2025_dev.yaml on the
  gb200-nvl72 preset (`validate_blackwell.NEMO`);
- tests/bench/validate.py's modern section: every run of published_modern_dev.yaml with a measured throughput
  (MT-NLG, MegaScale, torchtitan Dec-2024, NeMo 24.07 H100 FP8), all dense.
Left out, and why: published_2025_dev.yaml's torchao B200 rows (power-limited B200, the limit not stated) and
torchtitan nvfp4.md rows are scored only as recipe pairs (validate_blackwell.PAIRS: a ratio of two runs, not one
run's throughput); its two torchtitan GB200 Llama 4 Scout rows are marked DOUBTFUL by the data (GPU count 512 vs
256, local batch 10 vs 1, AC none vs full) and no script scores them. The criterion (issue 33): MoE geometric mean
of predicted/published within 0.9-1.1 and mean absolute error no worse than the dense rows'.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "bench")]

import validate  # noqa: E402
import validate_blackwell  # noqa: E402
import validate_moe_cp  # noqa: E402
from published import modern_dev_cases  # noqa: E402

from planner import load_model  # noqa: E402
from planner.model import is_moe  # noqa: E402
from tests import blackwell_runs  # noqa: E402


def rows() -> list[tuple[str, str, bool, float]]:
    """(script, run, MoE?, predicted / published) for every scored run (see the module's docstring)."""
    out = []
    for row in validate_moe_cp.ROWS:
        src, model, gpu, gpus = row[:4]
        m = validate_moe_cp.qwen3_235b_a22b() if model == "qwen3-235b-a22b" else load_model(model)
        unit, pub, pred, note = validate_moe_cp.score(row)
        oom = " (predicted OOM, ran)" if "predicted OOM" in note else ""
        out.append(("validate_moe_cp", f"{src}: {model} {gpu}x{gpus}{oom}", is_moe(m), pred / pub))
    for rid in validate_blackwell.NEMO:
        run = blackwell_runs.nemo_gb200_run(rid)
        out.append(("validate_blackwell", rid, is_moe(run.model),
                    validate_blackwell.tps(run) / run.tokens_per_s_per_gpu))
    for r in validate.evaluate(modern_dev_cases(), floor_per_source=True).rows:
        if r.case.tokens_per_s_per_gpu:
            out.append(("validate (modern)", r.case.id, is_moe(r.case.model), r.ratio))
    return out


def group_figures(ratios: list[float]) -> tuple[int, float, float]:
    """(runs, geometric mean of predicted/published, mean absolute error)."""
    return (len(ratios), math.exp(statistics.fmean(math.log(x) for x in ratios)),
            statistics.fmean(abs(x - 1) for x in ratios))


def main() -> int:
    scored = rows()
    for moe in (True, False):
        print(f"\n{'MoE' if moe else 'dense'} runs: script, run, predicted/published")
        for script, run, is_m, ratio in scored:
            if is_m == moe:
                print(f"  {script:18} {run[:80]:80} {ratio:5.2f}")
    print("\n| group | runs | geometric mean pred/pub | mean absolute error |\n|---|---|---|---|")
    figs = {}
    for name, moe in (("MoE", True), ("dense", False)):
        figs[name] = group_figures([r for _, _, m, r in scored if m == moe])
        n, g, e = figs[name]
        print(f"| {name} | {n} | {g:.3f} | {e:.1%} |")
    for script in dict.fromkeys(s for s, *_ in scored):
        dense = [r for s, _, m, r in scored if s == script and not m]
        n, g, e = group_figures(dense)
        print(f"| dense, {script} only | {n} | {g:.3f} | {e:.1%} |")
    _, g, e = figs["MoE"]
    met = 0.9 <= g <= 1.1 and e <= figs["dense"][2]
    print(f"\nissue 33 criterion (MoE geometric mean in 0.9-1.1, MoE error <= dense error): "
          f"{'met' if met else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
