"""Does `plan --calibration` predict this machine's probes better than the catalog? (real probes, then compare)

    python tests/bench/bench_calibration.py                       # CPU: --gpu CPU, fp32, 1 process, ~1 minute
    python tests/bench/bench_calibration.py --device cuda --gpu H100-SXM --precision bf16 --model llama32-1b.json

1. ``tune calibrate`` (probes.calibrate) on this machine with the model's GEMM shapes, written to a temporary file;
2. one probe (probes.launch.run_local, one process) per micro-batch size in ``--mbs``;
3. the planner's step time for each probed layout from the catalog alone and with ``--calibration``
   (planner.calibration.apply_calibration), and each one's error against the probe.

Prints a row per layout and the mean |log(planned / measured)| of both; exit status 1 when the calibrated plan is
not closer (``--check``). tests/test_calibration_cpu.py runs it on a small model. Each probe also profiles one step:
its compute seconds by op class (gemm, attention, elementwise; probes.train.op_class) against the planner's for
that step (search.calibration.probe_class_seconds), from the catalog and calibrated.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from planner.calibration import apply_calibration  # noqa: E402
from planner.hardware import make_cluster  # noqa: E402
from planner.model import ModelSpec, load_model  # noqa: E402
from planner.rank import estimate  # noqa: E402
from planner.space import Candidate, TrainingSpec  # noqa: E402
from search.calibration import probe_class_seconds  # noqa: E402

CPU_MODEL = ModelSpec(name="calibration-cpu", layers=4, hidden=256, heads=4, kv_heads=4, ffn_hidden=1024, vocab=1024,
                      seq_len=128, glu=False, tied_embeddings=False, position="rope", norm="rmsnorm", bias=False)
"""~4M parameters, GEMMs of 128-1024 rows on one CPU core: tens of ms a step"""


@dataclass(frozen=True, slots=True)
class Row:
    mbs: int
    measured_s: float
    catalog_s: float
    calibrated_s: float
    classes: tuple = ()
    """(class, measured s, catalog s, calibrated s) of the profiled step"""

    @property
    def catalog_error(self) -> float:
        return abs(math.log(self.catalog_s / self.measured_s))

    @property
    def calibrated_error(self) -> float:
        return abs(math.log(self.calibrated_s / self.measured_s))


def calibrate(model: ModelSpec, out: Path, *, device: str, gpu: str, precision: str) -> None:
    from probes.calibrate import main as calibrate_main

    model_file = out.with_name("model.yaml")
    model_file.write_text(_yaml(model))
    argv = ["--out", str(out), "--model", str(model_file), "--precision", precision, "--quiet", "--force"]
    argv += ["--cpu"] if device == "cpu" else ["--gpu", gpu]
    if calibrate_main(argv) != 0:
        raise SystemExit("tune calibrate failed")


def _yaml(model: ModelSpec) -> str:
    import yaml

    return yaml.safe_dump({k: v for k, v in model.to_dict().items() if v is not None})


def probe(model: ModelSpec, mbs: int, gas: int, workdir: Path, *, device: str, precision: str, steps: int):
    from probes.launch import run_local
    from probes.result import ProbeSpec

    cand = Candidate(tp=1, pp=1, dp=1, mbs=mbs, gas=gas)
    spec = ProbeSpec(model=model.to_dict(), candidate=cand.to_dict(), precision=precision, warmup_steps=2,
                     steps=steps, device=device, profile=True)
    r = run_local(spec, nproc=1, workdir=workdir, timeout_s=900)
    if not r.ok:
        raise SystemExit(f"probe MBS {mbs} {r.status}: {r.reason}")
    return r.step_time_median_s, r.timing_split.get("compute_s_by_class") or {}


def compare(model: ModelSpec, mbs_list: list[int], gas: int, *, device: str = "cpu", gpu: str = "CPU",
            precision: str = "fp32", steps: int = 4) -> list[Row]:
    cluster = make_cluster(gpu=gpu, gpus=1, gpus_per_node=1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-calibration-") as tmp:
        cal = Path(tmp) / "calibration.yaml"
        calibrate(model, cal, device=device, gpu=gpu, precision=precision)
        calibrated = apply_calibration(cluster, str(cal))
        for mbs in mbs_list:
            measured, by_class = probe(model, mbs, gas, Path(tmp) / f"mbs{mbs}", device=device, precision=precision,
                                       steps=steps)
            training = TrainingSpec(global_batch=mbs * gas, seq_len=model.seq_len, precision=precision,
                                    framework="megatron-lm")
            cand = Candidate(tp=1, pp=1, dp=1, mbs=mbs, gas=gas)
            planned = [estimate(model, c, training, cand).time.step_time_s for c in (cluster, calibrated)]
            pred = [probe_class_seconds(model, c, training, cand) for c in (cluster, calibrated)]
            classes = tuple((k, by_class.get(k, 0.0), pred[0][k], pred[1][k]) for k in pred[0])
            rows.append(Row(mbs=mbs, measured_s=measured, catalog_s=planned[0], calibrated_s=planned[1],
                            classes=classes))
        print(f"calibration: {calibrated.calibration}")
    return rows


def mean_errors(rows: list[Row]) -> tuple[float, float]:
    return (sum(r.catalog_error for r in rows) / len(rows), sum(r.calibrated_error for r in rows) / len(rows))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--gpu", default="CPU", help="catalog id the plan is for (CPU on the CPU)")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--model", default=None, help="model preset or file (default a 4M-parameter CPU model)")
    p.add_argument("--mbs", default="1,2,4,8", help="micro-batch sizes to probe")
    p.add_argument("--gas", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--check", action="store_true", help="exit 1 unless the calibrated plan is closer")
    args = p.parse_args(argv)
    model = load_model(args.model) if args.model else CPU_MODEL
    rows = compare(model, [int(x) for x in args.mbs.split(",")], args.gas, device=args.device, gpu=args.gpu,
                   precision=args.precision, steps=args.steps)
    print(f"{model.name} on {args.device}, plan --gpu {args.gpu}, {args.precision}, GAS {args.gas}")
    print(f"{'MBS':>4} {'probe ms':>9} {'catalog ms':>11} {'err':>6} {'calibrated ms':>14} {'err':>6}")
    for r in rows:
        print(f"{r.mbs:>4} {r.measured_s * 1e3:9.1f} {r.catalog_s * 1e3:11.1f} {r.catalog_error:6.1%} "
              f"{r.calibrated_s * 1e3:14.1f} {r.calibrated_error:6.1%}")
    print("profiled step by op class, ms: measured / catalog / calibrated")
    for r in rows:
        print(f"{r.mbs:>4} " + "  ".join(f"{k} {m * 1e3:.1f} / {a * 1e3:.1f} / {b * 1e3:.1f}" for k, m, a, b in r.classes))
    catalog, calibrated = mean_errors(rows)
    print(f"mean |log(plan/probe)|: catalog {catalog:.1%}, calibrated {calibrated:.1%}")
    return 1 if args.check and calibrated >= catalog else 0


if __name__ == "__main__":
    sys.exit(main())
