"""The README's example outputs, regenerated from the commands that print them.

    python3 tests/bench/readme_examples.py --check          # exit 1 and name every stale block
    python3 tests/bench/readme_examples.py --write          # rerun every command, rewrite the stale blocks
    python3 tests/bench/readme_examples.py --check --fast   # only the plan examples (tests/test_readme_examples.py)
    python3 tests/bench/readme_examples.py --write --only bloom-top5 mixtral-top3

Each block in README.md sits between `<!-- example: NAME -->` and `<!-- /example -->` and holds one fenced code
block: `$ plan ...` (or `$ tune ...`, `$ cat FILE`) followed by what it printed, cut where the Step says (a cut is
shown as `...`). Commands run as `python3 -m planner.cli` / `python3 -m search.cli` from this checkout, in a fresh
temporary folder that links the repository's examples/ and tests/ (so relative paths read as in the README) and
holds the Example's files; that folder's absolute path is shown as `$PWD` (tune's dashboard command names the
study's absolute path). Timings ("scored in 0.14 s") are not compared: `--write` leaves a block alone when only they
differ. Figures the prose quotes from a block are checked against it (CLAIMS; --check names any that disagree).
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MODULES = {"plan": "planner.cli", "tune": "search.cli"}       # the console scripts of pyproject.toml
LINKED = ("examples", "tests")                                # repository folders the commands read
BLOCK = re.compile(r"(<!-- example: (?P<name>[\w.-]+) -->\n```[a-z]*\n)(?P<body>.*?)(```\n<!-- /example -->)", re.S)
VOLATILE = ((re.compile(r"scored in \d+(\.\d+)? s"), "scored in _ s"),)   # wall-clock figures, never compared


@dataclass(frozen=True)
class Step:
    """One command of a block and the part of its output the README shows."""
    argv: tuple[str, ...]          # ("plan", ...), ("tune", ...), ("python3", "tests/bench/SCRIPT.py", ...) or
                                   # ("cat", FILE): FILE as the commands before left it
    start: str | None = None       # regex: show from the first line matching (else from the top)
    stop: str | None = None        # regex: show up to, not including, the first line after start matching
    rc: int = 0                    # the exit status the command must end with (2: an input error)


@dataclass(frozen=True)
class Example:
    name: str
    steps: tuple[Step, ...]
    files: tuple[tuple[str, str], ...] = ()    # (name, text) written into the work folder first
    slow: bool = False                         # not plan: left out of --fast (tune's extras, benches: seconds each)


@dataclass(frozen=True)
class Claim:
    """A figure the README's prose states about a block's output: the sentence (a regex whose groups are the
    figures, found once in README.md) and the figures as the block makes them, so a regenerated block whose numbers
    moved fails the prose that quotes them (issue 32.6)."""
    block: str
    prose: str
    figures: "Callable[[str], tuple[str, ...]]"


def _num(pattern: str, text: str) -> float:
    m = re.search(pattern, text, re.M)
    if m is None:
        raise ValueError(f"no line matches {pattern!r}")
    return float(m[1].replace(",", ""))


def _row(text: str, start: str) -> list[str]:
    line = next((ln for ln in text.splitlines() if re.match(start, ln)), None)
    if line is None:
        raise ValueError(f"no row matches {start!r}")
    return line.split()


def _per_gpu(text: str, gpus: int, measured: float) -> tuple[str, ...]:
    tokens = _num(r"([\d,]+) tokens/s$", text)
    return f"{tokens:,.0f}", f"{tokens / gpus:,.0f}", f"{tokens / gpus / measured:.2f}"


RANK_WORDS = ("first", "second", "third", "fourth", "fifth")
STEP, HW, TOTAL = r"^step +([\d.]+)", r"hardware TFLOPs/GPU ([\d.]+)", r"^total +([\d.]+)"
DEEPSEEK_GB = r"^DeepSeek-V3 report.* (\d+) GB"
ALL_ROWS = r"^[|] all [|] (\d+) [|]"
SPREAD = r"spread of predicted/measured inside a table.*\| ([\d.]+) \|$"


def _bloom(t: str) -> tuple[str, ...]:     # BigScience's log: 104.70 s per iteration
    step = _num(STEP, t)
    return f"{step:.2f}", f"{(step / 104.70 - 1) * 100:+.1f}", f"{_num(HW, t):.1f}"


def _ordinal(n: int) -> str:
    """1 -> "first" ... 5 -> "fifth", then "21st", "22nd", "29th"."""
    if n <= len(RANK_WORDS):
        return RANK_WORDS[n - 1]
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _rank_of(t: str, tp: str, pp: str, ep: str, mbs: str) -> tuple[str, ...]:
    """The rank plan prints (first column) on the first row of the block with this TP, PP, EP and MBS."""
    rows = [ln.split() for ln in t.splitlines() if re.match(r"\d+~? ", ln)]
    return (next(_ordinal(int(r[0].rstrip("~"))) for r in rows if (r[1], r[2], r[4], r[5]) == (tp, pp, ep, mbs)),)


CLAIMS: tuple[Claim, ...] = (
    Claim("bloom-explain", r"compare `step` \(([\d.]+) s, ([+-][\d.]+)%\) and the hardware TFLOPs/GPU \(([\d.]+)\)",
          _bloom),
    Claim("torchtitan-405b-explain",
          r"([\d,]+) tokens/s over 512 GPUs is ([\d,]+) per GPU, ([\d.]+)x the measured 128; ([\d.]+) GB predicted",
          lambda t: _per_gpu(t, 512, 128) + (f"{_num(TOTAL, t):.1f}",)),
    Claim("megatron-overlap-explain", r"([\d,]+) tokens/s over 64 GPUs is ([\d,]+) per GPU, ([\d.]+)x the published",
          lambda t: _per_gpu(t, 64, 1602)),
    Claim("qwen3-moe-top3", r"runs TP1 PP2 EP8, MBS 2; it comes (\w+)", lambda t: _rank_of(t, "1", "2", "8", "2")),
    Claim("validate-summary", r"the spread of predicted/measured inside a table is ([\d.]+)",
          lambda t: (f"{_num(SPREAD, t):.3f}",)),
    Claim("validate-summary", r"(\d+) of the 50 rows give an", lambda t: (f"{_num(ALL_ROWS, t):.0f}",)),
    Claim("memory-fit", r"most of the (\d+) OOMs predicted to fit", lambda t: (_row(t, r"all ")[-1],)),
    Claim("validate-moe-cp", r"of its published tokens/s without, ([\d.]+) with",
          lambda t: (_row(t, r".*qwen3-235b-a22b")[-6],)),
    Claim("validate-moe-cp", r"planned eager, ([\d.]+) with them", lambda t: (_row(t, r".*B200 +qwen3-30b-a3b")[-6],)),
    Claim("validate-moe-cp", r"under 1F1B and ([\d.]+) under DualPipe", lambda t: (_row(t, r"DeepSeek-V3 report")[11],)),
    Claim("validate-moe-cp", r"plan has it at (\d+) GB", lambda t: (f"{_num(DEEPSEEK_GB, t):.0f}",)),
)


def wrong_claims(readme: str) -> list[str]:
    """Each prose figure that disagrees with the block it quotes, as 'block: prose says X, the block Y'."""
    have, out = blocks(readme), []
    for claim in CLAIMS:
        found = list(re.finditer(claim.prose, readme))
        if len(found) != 1:
            out.append(f"{claim.block}: the prose {claim.prose!r} is in README.md {len(found)} times, not once")
            continue
        said, made = found[0].groups(), claim.figures(have[claim.block])
        if tuple(said) != tuple(made):
            out.append(f"{claim.block}: the prose says {', '.join(said)} where the block makes {', '.join(made)}")
    return out


def plan(*args: str, **cut) -> Step:
    return Step(("plan", *args), **cut)


EXAMPLES: tuple[Example, ...] = (
    Example("bloom-top5", (plan("--model", "176B", "--gpus", "384", "--top", "5"),)),
    Example("bloom-explain", (plan("--model", "176B", "--gpus", "384", "--cluster", "jean-zay-a100", "--explain",
                                   "tp=4,pp=12,mbs=2,recompute=full,zero=1"),)),
    Example("rampup-schedule", (plan("--model", "1B3", "--nodes", "16", "--gpus-per-node", "4", "--gpu", "V100-16GB",
                                     "--precision", "fp16", "--recompute", "full", "--rampup", "32", "32", "2000000",
                                     "--rampup-schedule", start="^Rampup schedule"),)),
    Example("bloom-jean-zay-top5", (plan("--model", "176B", "--gpus", "384", "--cluster", "jean-zay-a100", "--top",
                                         "5", start="^Top ", stop="^~ :"),)),
    Example("mixtral-top3", (plan("--model", "mixtral-8x22b", "--gpus", "1024", "--gpu", "H100-SXM", "--top", "3",
                                  stop="^~ :"),)),
    Example("llama31-405b-top3", (plan("--model", "llama3.1-405b", "--gpus", "16384", "--gpu", "H100-SXM", "--top",
                                       "3", stop="^~ :"),)),
    Example("qwen3-moe-top3", (plan("--model", "qwen3-30b-a3b", "--gpus", "128", "--gpu", "H100", "--seq-len", "4096",
                                    "--global-batch", "512", "--precision", "bf16", "--top", "3", start="^Top ",
                                    stop="^~ :"),
                               # NVIDIA's layout (TP1 PP2 EP8 MBS 2) where it first comes in a longer list
                               plan("--model", "qwen3-30b-a3b", "--gpus", "128", "--gpu", "H100", "--seq-len", "4096",
                                    "--global-batch", "512", "--precision", "bf16", "--top", "40",
                                    start=r"^\d+~? +1 +2 +64 +8 +2 ", stop=r"^(?!\d+~? +1 +2 +64 +8 +2 )"))),
    Example("llama3-405b-block", (plan("--model", "llama3-405b", "--gpus", "8192", "--gpu", "H100-SXM", "--framework",
                                       "megatron-lm", "--seq-len", "8192", "--global-batch", "2048", "--tp", "8",
                                       "--pp", "16", "--top", "3", start="^Top ", stop="^~ :"),)),
    Example("megatron-overlap-explain", (plan("--model", "llama3-70b", "--gpus", "64", "--gpu", "H100", "--framework",
                                              "megatron-lm", "--global-batch", "128", "--seq-len", "8192", "--precision",
                                              "fp8", "--fp8-recipe", "tensorwise", "--grad-reduce-dtype", "bf16",
                                              "--overlap", "grad-reduce,param-gather,tp-comm,p2p", "--flops-attention",
                                              "causal", "--explain", "tp=4,pp=8,mbs=1,recompute=none,zero=1,sp=1,vpp=5",
                                              start="^Terms"),)),
    Example("deepseek-savers-explain", (plan("--model", "deepseek-v3", "--gpus", "1024", "--gpu", "H100-SXM",
                                             "--global-batch", "8192", "--optimizer-offload", "1", "--explain",
                                             "tp=2,pp=8,vpp=4,ep=64,mbs=1,sp=1,zero=1,recompute=modules:mla_up_proj+mlp",
                                             start="^Memory savers"),)),
    Example("deepseek-opt-offload-explain", (plan("--model", "deepseek-v3", "--gpus", "1024", "--gpu", "H100-SXM",
                                                  "--global-batch", "8192", "--framework", "megatron-lm", "--explain",
                                                  "tp=2,pp=8,vpp=2,ep=8,mbs=1,sp=1,zero=1,recompute=full,"
                                                  "opt_offload=0.75", start="^Memory savers"),)),
    Example("torchtitan-405b-explain", (plan("--model", "llama3.1-405b", "--gpus", "512", "--gpu", "H100-HBM2e-96GB",
                                             "--framework", "fsdp", "--global-batch", "256", "--seq-len", "8192",
                                             "--precision", "fp8", "--fp8-recipe", "tensorwise", "--torch-compile",
                                             "--async-tp", "--pp-schedule", "Interleaved1F1B", "--explain",
                                             "tp=8,pp=8,mbs=4,recompute=full,zero=3,sp=1,vpp=2"),)),
    Example("hf-config", (plan("--model", "tests/fixtures/hf_configs/Llama-3.1-8B.json", "--gpus", "64", "--gpu",
                               "H100-SXM", "--global-batch", "512", "--seq-len", "8192", stop="^$"),)),
    Example("gpu-file", (plan("--model", "llama2-7b", "--gpus", "16", "--gpu", "examples/gpu-rtx-4090.yaml",
                              "--seq-len", "2048", "--global-batch", "64", "--top", "3", stop="^~ :"),)),
    Example("framework-refused", (plan("--model", "llama3-8b", "--gpus", "64", "--framework", "megatron-deepspeed",
                                       rc=2),)),
    Example("emit-megatron-lm", (plan("--model", "llama3-8b", "--gpus", "64", "--gpu", "H100-SXM", "--emit",
                                      "megatron-lm", "--out", "run/", start="^wrote "),
                                 Step(("cat", "run/launch.sbatch"), stop="^#SBATCH"))),
    Example("input-errors", (
        plan("--model", "176B", "--cluster", "c.yaml", rc=2),
        plan("--model", "176B", "--gpus", "384", "--calibration", "cal.yaml", rc=2),
        plan("--model", "176B", "--gpus", "384", "--train-tokens", "nan", rc=2),
        plan("--model", "176B", "--gpus", "384", "--pick", "2", rc=2),
        plan("--model", "176B", "--gpus", "8", rc=2)),
        files=(("c.yaml", "gpu: A100-80GB\ngpus_per_node: 8\nnodes: 1.5\n"),
               ("cal.yaml", "device: A100-80GB\nmatmul_eficiency: 0.7\n"))),
    Example("tune-replay", (Step(("tune", "--model", "1B3", "--cluster", "examples/cluster-2x4-v100-16gb.yaml",
                                  "--precision", "fp16", "--recompute", "full", "--zero", "1", "--no-rampup", "--study",
                                  "v100-16gb", "--backend", "replay", "--results", "tests/data/bigscience_1b3_v100.csv",
                                  "--results-table", "v100-16gb-recompute", "--no-progress")),),
            slow=True),
    Example("fitted-constants", (Step(("python3", "tests/bench/fitted_constants.py")),)),
    Example("validate-summary", (Step(("python3", "tests/bench/validate.py"), start="^Summary"),), slow=True),
    Example("memory-fit", (Step(("python3", "tests/bench/memory_fit.py")),), slow=True),
    Example("validate-moe-cp", (Step(("python3", "tests/bench/validate_moe_cp.py")),), slow=True),
)


def _cut(text: str, step: Step) -> list[str]:
    lines = [line.rstrip() for line in text.rstrip("\n").split("\n")]
    first = 0
    if step.start is not None:
        first = next((i for i, line in enumerate(lines) if re.search(step.start, line)), None)
        if first is None:
            raise RuntimeError(f"{shlex.join(step.argv)}: no output line matches start {step.start!r}")
    last = len(lines)
    if step.stop is not None:
        last = next((i for i in range(first, len(lines)) if re.search(step.stop, lines[i])), last)
    return (["..."] if first else []) + lines[first:last] + (["..."] if last < len(lines) else [])


def _run(step: Step, work: Path) -> str:
    if step.argv[0] == "cat":
        return (work / step.argv[1]).read_text()
    env = dict(os.environ, PYTHONUNBUFFERED="1",     # stdout and stderr in the order a terminal shows them
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, *step.argv[1:]] if step.argv[0] == "python3" else \
        [sys.executable, "-m", MODULES[step.argv[0]], *step.argv[1:]]
    proc = subprocess.run(command, cwd=work, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    if proc.returncode != step.rc:
        raise RuntimeError(f"{shlex.join(step.argv)}: exit status {proc.returncode}, expected {step.rc}:\n"
                           f"{proc.stdout[-4000:]}")
    return proc.stdout


def render(example: Example) -> str:
    """The block's text: each command as `$ ...` and the part of its output the Step keeps."""
    with tempfile.TemporaryDirectory(prefix="readme-example-") as tmp:
        work = Path(tmp).resolve()
        for name in LINKED:
            (work / name).symlink_to(REPO / name, target_is_directory=True)
        for name, text in example.files:
            (work / name).write_text(text)
        out = []
        for step in example.steps:
            out += ["$ " + shlex.join(step.argv)] + _cut(_run(step, work), step)
        return "\n".join(out).replace(str(work), "$PWD") + "\n"   # the folder it ran in, as a shell names it


def blocks(readme: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for m in BLOCK.finditer(readme):
        if m["name"] in found:
            raise ValueError(f"README.md: example block {m['name']!r} appears twice")
        found[m["name"]] = m["body"]
    return found


def comparable(text: str) -> str:
    for pattern, replacement in VOLATILE:
        text = pattern.sub(replacement, text)
    return text


def stale(readme: str, fresh: dict[str, str]) -> list[str]:
    """Names of the blocks whose README text differs from the fresh output (timings aside)."""
    have = blocks(readme)
    missing = sorted(set(fresh) - set(have))
    if missing:
        raise ValueError(f"README.md has no block for {', '.join(missing)}: add <!-- example: NAME --> markers")
    return [name for name, text in fresh.items() if comparable(have[name]) != comparable(text)]


def replace(readme: str, fresh: dict[str, str]) -> str:
    """README with every stale block replaced by its fresh text."""
    names = set(stale(readme, fresh))
    return BLOCK.sub(lambda m: m[1] + fresh[m["name"]] + m[4] if m["name"] in names else m[0], readme)


def selected(only: list[str] | None, fast: bool) -> list[Example]:
    known = {e.name for e in EXAMPLES}
    unknown = sorted(set(only or ()) - known)
    if unknown:
        raise ValueError(f"unknown example {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return [e for e in EXAMPLES if (not only or e.name in only) and not (fast and e.slow)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 naming every block whose output changed")
    mode.add_argument("--write", action="store_true", help="rewrite the blocks whose output changed")
    p.add_argument("--fast", action="store_true", help="only the plan examples (not the tune replay)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="only these examples")
    p.add_argument("--readme", type=Path, default=README)
    args = p.parse_args(argv)
    try:
        chosen = selected(args.only, args.fast)
        text = args.readme.read_text()
    except (ValueError, OSError) as err:
        p.error(str(err))
    fresh = {e.name: render(e) for e in chosen}
    try:
        names = stale(text, fresh)
    except ValueError as err:           # a block missing or twice
        p.error(str(err))
    if args.write:
        if names:
            args.readme.write_text(replace(text, fresh))
        print(f"readme_examples: rewrote {', '.join(names)}" if names else "readme_examples: every block is current")
        return 0
    have = blocks(text)
    wrong = wrong_claims(replace(text, fresh) if names else text)
    for line in wrong:
        print(f"README prose beside a block: {line}")
    for name in names:
        diff = difflib.unified_diff(have[name].splitlines(), fresh[name].splitlines(), "README.md", "now", lineterm="")
        print(f"stale README block {name!r}:\n" + "\n".join(list(diff)[:40]))
    if names or wrong:
        if names:
            print(f"readme_examples: {len(names)} stale block(s): {', '.join(names)}; "
                  "run python3 tests/bench/readme_examples.py --write")
        return 1
    print(f"readme_examples: {len(fresh)} block(s) current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
