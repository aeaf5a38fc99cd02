"""The driver tests/test_megatron_parser.py runs in a Megatron checkout's interpreter (no pytest needed there).

stdin: a JSON list of argument sets {id, argv, world, env, capability, attrs}; stdout: one JSON line per set,
{id, stage: "ok" | the stage that refused it, error, attrs: the parsed values asked for}. Holds no test.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import sys
import types


def drive() -> None:
    import torch

    # Megatron-LM: megatron/training/arguments.py; the Megatron-DeepSpeed forks: megatron/arguments.py
    lm = os.path.isfile(os.path.join("megatron", "training", "arguments.py"))   # cwd: the checkout
    arguments = importlib.import_module("megatron.training.arguments" if lm else "megatron.arguments")

    for case in json.load(sys.stdin):
        major, minor = case["capability"]
        # validate_args asks the (absent) GPU for its compute capability: answer with the planned GPU's.
        torch.cuda.get_device_capability = lambda *a, **k: (major, minor)
        torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(major=major, minor=minor)
        for name in ("CUDA_DEVICE_MAX_CONNECTIONS", "WORLD_SIZE", "RANK"):
            os.environ.pop(name, None)
        os.environ.update(case["env"], WORLD_SIZE=str(case["world"]), RANK="0")
        sys.argv = ["pretrain_gpt.py", *case["argv"]]
        out = {"id": case["id"], "stage": "parse_args"}
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                args = arguments.parse_args(ignore_unknown_args=False)
                out["stage"] = "validate_args"
                if hasattr(arguments, "validate_args"):   # the bigscience fork validates inside parse_args
                    arguments.validate_args(args)
            out.update(stage="ok", attrs={k: getattr(args, k, "<absent>") for k in case["attrs"]})
        except SystemExit:   # argparse: "pretrain_gpt.py: error: ..."
            out["error"] = err.getvalue().strip().splitlines()[-1:]
        except Exception as e:   # validate_args asserts
            out["error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    drive()
