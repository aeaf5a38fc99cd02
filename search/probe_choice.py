"""Which program a tune probe runs: the job that will be launched when its framework is here, else the stand-in.

    >>> choose(probe="auto", framework="fsdp", device="cuda")             # torchtitan importable here
    ProbeChoice(program='torchtitan', reason='torchtitan 0.3.0 is importable and probes run on CUDA', ...)
    >>> choose(probe="auto", framework="fsdp", device="cpu").line()
    'stand-in (plantune's torch GPT): torchtitan's trainer needs a CUDA device ...'

``--probe auto`` (the default) measures the program the plan emits for (``--framework``): Megatron-LM's
``pretrain_gpt.py`` with the emitted arguments and mock data (``--megatron-path DIR``, or the ``pretrain_gpt.py``
beside an importable ``megatron`` package), the user's ``--command`` for either Megatron, torchtitan's trainer
with the emitted config when ``torchtitan`` is importable. Anything else, or a framework that cannot run where the
probes run, falls back to plantune's own torch GPT (probes/train.py), and the reason is kept: tune prints it and
stores it in every trial (``program``, ``program_reason``). ``--probe train`` forces the stand-in, ``--probe
megatron`` the user's ``--command`` (as before ``auto`` existed). No torch here (only module look-ups).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from planner.errors import InputError

STAND_IN = "stand-in"
MEGATRON_LM = "megatron-lm"
MEGATRON_DEEPSPEED = "megatron-deepspeed"
TORCHTITAN = "torchtitan"
PROGRAMS = (STAND_IN, MEGATRON_LM, MEGATRON_DEEPSPEED, TORCHTITAN)
DESCRIPTION = {STAND_IN: "stand-in (plantune's torch GPT)", MEGATRON_LM: "Megatron-LM", MEGATRON_DEEPSPEED:
               "Megatron-DeepSpeed", TORCHTITAN: "torchtitan"}
SCRIPT = "pretrain_gpt.py"
MOCK_DATA = ("--mock-data", "--tokenizer-type", "NullTokenizer")
"""Megatron-LM's own synthetic dataset and tokenizer (megatron/training/arguments.py): no data, no tokenizer files;
the vocabulary size (``--vocab-size``) is the model's"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeChoice:
    """The program that measures this run's probes, and why it is that one."""

    program: str
    """one of PROGRAMS"""
    reason: str
    """one line: why this program (for the stand-in, why not the framework's own)"""
    command: tuple[str, ...] = ()
    """the Megatron command as an argument list (``{args}`` where the emitted arguments go); empty otherwise"""
    cwd: str = ""
    """where the Megatron command runs (the script's folder when plantune found or was given it)"""
    flavor: str = ""
    """the Megatron-DeepSpeed fork, or "megatron-lm" (probes.megatron's flavor); "" for the others"""
    version: str = ""
    """torchtitan's installed version (which emitter writes its config)"""

    @property
    def framework(self) -> bool:
        """The program is the framework the plan emits for (not the stand-in)."""
        return self.program != STAND_IN

    def line(self) -> str:
        return f"{DESCRIPTION[self.program]}: {self.reason}"


def _stand_in(reason: str) -> ProbeChoice:
    return ProbeChoice(program=STAND_IN, reason=reason)


def _module_dir(name: str, find_spec: Callable) -> Path | None:
    """The folder holding package ``name``'s folder (a source checkout's root), or None when it is not importable."""
    try:
        spec = find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    places = list(spec.submodule_search_locations or []) or ([spec.origin] if spec.origin else [])
    for place in places:
        path = Path(place)
        return (path.parent if path.name == "__init__.py" else path).parent
    return None


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


def megatron_script(path: str) -> Path:
    """``--megatron-path DIR``: DIR/pretrain_gpt.py (or DIR itself when it names the script); InputError else."""
    p = Path(path).expanduser()
    script = p if p.name == SCRIPT else p / SCRIPT
    if not script.is_file():
        raise InputError(f"--megatron-path {path}: no {SCRIPT} there; give the Megatron-LM checkout that holds it "
                         "(or --command \"python .../pretrain_gpt.py {args} ...\")")
    return script.resolve()


def megatron_lm_command(script: Path, vocab: int) -> tuple[str, ...]:
    """The argument list that runs Megatron-LM's ``script`` with the emitted arguments on mock data."""
    return ("python", "-u", str(script), "{args}", *MOCK_DATA, "--vocab-size", str(vocab))


def choose(*, probe: str, framework: str, flavor: str = "bigscience", device: str, command: str | None = None,
           megatron_path: str | None = None, vocab: int = 0,
           find_spec: Callable = importlib.util.find_spec, version: Callable[[str], str] = _version) -> ProbeChoice:
    """The program for ``--probe`` (auto | train | megatron | torchtitan) under ``--framework`` (megatron-deepspeed |
    megatron-lm | fsdp), probes on ``device`` (cuda | cpu, resolved). ``command``/``megatron_path`` are the user's
    flags; ``vocab`` the model's vocabulary (Megatron-LM's mock data). InputError for flags that contradict."""
    megatron_flavor = MEGATRON_LM if framework == MEGATRON_LM else flavor
    megatron_program = MEGATRON_LM if framework == MEGATRON_LM else MEGATRON_DEEPSPEED
    if probe == "train":
        if command or megatron_path:
            raise InputError("--probe train runs plantune's stand-in and takes no --command or --megatron-path; "
                             "drop them, or use --probe auto")
        return _stand_in("--probe train")
    if probe == TORCHTITAN:
        if framework != "fsdp":
            raise InputError(f"--probe torchtitan runs the torchtitan config the plan emits for --framework fsdp, and "
                             f"the plan is for {framework}; add --framework fsdp, or use --probe auto")
        if command or megatron_path:
            raise InputError("--probe torchtitan takes no --command or --megatron-path (they name a Megatron script)")
        if _module_dir("torchtitan", find_spec) is None:
            raise InputError("--probe torchtitan: torchtitan is not importable here; pip install torchtitan==0.3.0, or "
                             "use --probe auto (the stand-in measures when torchtitan is absent)")
        from planner.framework import TORCHTITAN_VERSIONS

        installed = version("torchtitan")
        if installed != TORCHTITAN_VERSIONS[0]:
            raise InputError(f"--probe torchtitan runs torchtitan {TORCHTITAN_VERSIONS[0]}'s Python config, and "
                             f"torchtitan {installed or '(version unknown)'} is installed; "
                             f"pip install torchtitan=={TORCHTITAN_VERSIONS[0]}")
        return ProbeChoice(program=TORCHTITAN, reason=f"--probe torchtitan (torchtitan {installed})",
                           version=installed)
    if probe == "megatron":
        if not command:
            raise InputError("--probe megatron needs --command \"python pretrain_gpt.py {args} ...\"")
        return ProbeChoice(program=megatron_program, reason="--probe megatron, your --command",
                           flavor=megatron_flavor)
    if command and framework not in (MEGATRON_LM, MEGATRON_DEEPSPEED):
        raise InputError(f"--command runs a Megatron script, and the plan is for --framework {framework}; plan for "
                         "megatron-lm or megatron-deepspeed, or drop --command")
    if megatron_path and framework not in (MEGATRON_LM, MEGATRON_DEEPSPEED):
        raise InputError(f"--megatron-path names a Megatron checkout, and the plan is for --framework {framework}; "
                         "plan for megatron-lm, or drop --megatron-path")
    if framework in (MEGATRON_LM, MEGATRON_DEEPSPEED):
        return _choose_megatron(framework, megatron_program, megatron_flavor, device=device, command=command,
                                megatron_path=megatron_path, vocab=vocab, find_spec=find_spec)
    if framework == "fsdp":
        if _module_dir("torchtitan", find_spec) is None:
            return _stand_in("torchtitan is not importable here (pip install torchtitan)")
        installed = version("torchtitan")
        if device != "cuda":
            return _stand_in(f"torchtitan's trainer needs a CUDA device and probes run on the {device} (it picks "
                             "cuda when no accelerator is present and calls torch.cuda.set_device)")
        from planner.framework import TORCHTITAN_VERSIONS

        if installed != TORCHTITAN_VERSIONS[0]:
            return _stand_in(f"torchtitan {installed or '(version unknown)'} is installed and plantune's torchtitan "
                             f"probe runs {TORCHTITAN_VERSIONS[0]}'s Python config (mock data)")
        return ProbeChoice(program=TORCHTITAN, reason=f"torchtitan {installed} is importable and probes run on "
                                                      f"{device}", version=installed)
    return _stand_in(f"no trainer of --framework {framework} to run")


def _choose_megatron(framework: str, program: str, flavor: str, *, device: str, command: str | None,
                     megatron_path: str | None, vocab: int, find_spec: Callable) -> ProbeChoice:
    if command:
        return ProbeChoice(program=program, reason="your --command", flavor=flavor)
    if megatron_path:
        script = megatron_script(megatron_path)
        if framework != MEGATRON_LM:
            raise InputError(f"--megatron-path runs Megatron-LM on mock data; Megatron-DeepSpeed's {SCRIPT} needs "
                             f"your dataset: give --command \"python {script} {{args}} --data-path PREFIX\"")
        return ProbeChoice(program=program, reason=f"--megatron-path {script.parent}, mock data",
                           command=megatron_lm_command(script, vocab), cwd=str(script.parent), flavor=flavor)
    root = _module_dir("megatron", find_spec)
    script = root / SCRIPT if root is not None else None
    if script is None or not script.is_file():
        found = "" if root is None else f" (the megatron package at {root} has no {SCRIPT} beside it)"
        how = (f"give --megatron-path DIR (the checkout holding {SCRIPT}) or --command" if framework == MEGATRON_LM
               else f"give --command \"python {SCRIPT} {{args}} --data-path PREFIX\" to probe with it")
        return _stand_in(f"{DESCRIPTION[program]} not found{found}: {how}")
    if framework != MEGATRON_LM:
        return _stand_in(f"Megatron-DeepSpeed found at {root}, but its {SCRIPT} needs your dataset: give --command "
                         f"\"python {script} {{args}} --data-path PREFIX\"")
    if device != "cuda":
        return _stand_in(f"Megatron-LM found at {root}, and it needs a CUDA device (probes run on the {device}); "
                         "--megatron-path runs it anyway")
    return ProbeChoice(program=program, reason=f"Megatron-LM found at {root} (importable), mock data",
                       command=megatron_lm_command(script.resolve(), vocab), cwd=str(root), flavor=flavor)


__all__ = ["DESCRIPTION", "MEGATRON_DEEPSPEED", "MEGATRON_LM", "PROGRAMS", "ProbeChoice", "STAND_IN", "TORCHTITAN",
           "choose", "megatron_lm_command", "megatron_script"]
