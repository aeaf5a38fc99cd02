"""The driver tests/test_megatron_parser.py runs in a Megatron checkout's interpreter (no pytest needed there).

stdin: a JSON list of argument sets {id, argv, world, env, capability, attrs, vocab}; stdout: one JSON line per set,
{id, stage: "ok" | the stage that refused it, error, attrs: the parsed values asked for}. Holds no test.

After parse_args and validate_args, each set goes through the tokenizer's vocabulary padding, as pretrain_gpt.py's
build_tokenizer does with the tokenizer's size (``vocab``): Megatron-LM's
megatron/core/tokenizers/utils/build_tokenizer.py ``vocab_size_with_padding`` (megatron-core 0.17;
megatron/training/tokenizer/tokenizer.py ``_vocab_size_with_padding`` in older checkouts), the forks'
megatron/tokenizer/tokenizer.py ``_vocab_size_with_padding`` (the BigScience fork's raises "N is not divisible by
128" for a --pad-vocab-size-to that is not). ``attrs`` may then ask for ``padded_vocab_size``. A
``--pipeline-model-parallel-layout`` goes through Megatron-Core's own layout checks (PipelineParallelLayerLayout and
its ``validate_layer_layout``, which TransformerConfig runs; the rest of TransformerConfig needs transformer-engine).
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
    _read_help_texts_once()

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
                layout = getattr(args, "pipeline_model_parallel_layout", None)
                if layout is not None:   # what TransformerConfig.__post_init__ checks of it (needs no GPU)
                    out["stage"] = "pipeline_layout"
                    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

                    PipelineParallelLayerLayout(layout, args.pipeline_model_parallel_size).validate_layer_layout(
                        args.num_layers, args.mtp_num_layers)
                out["stage"] = "vocab_padding"
                args.padded_vocab_size = _padding(lm)(case["vocab"], args)
            out.update(stage="ok", attrs={k: getattr(args, k, "<absent>") for k in case["attrs"]})
        except SystemExit:   # argparse: "pretrain_gpt.py: error: ..."
            out["error"] = err.getvalue().strip().splitlines()[-1:]
        except Exception as e:   # validate_args asserts
            out["error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(out), flush=True)


def _read_help_texts_once() -> None:
    """Megatron-LM (megatron/training/argument_utils.py, core_v0.17) builds its parser afresh in every parse_args and
    reads each config dataclass's field docstrings, its arguments' help texts, from the class's source each time
    (``ArgumentGroupFactory._get_field_docstrings``: inspect.getsource and ast.parse, ~0.2 s of a set's ~0.25 s).
    A class's source does not change while this driver runs, so each class's docstrings are read once and handed
    to every later parser as a copy; the parsing and validation are still the framework's own, set by set."""
    try:
        factory = importlib.import_module("megatron.training.argument_utils").ArgumentGroupFactory
    except (ImportError, AttributeError):   # the forks and older checkouts have no such factory
        return
    read, cache = factory._get_field_docstrings, {}

    def read_once(self, src_cfg_class):
        if src_cfg_class not in cache:
            cache[src_cfg_class] = read(self, src_cfg_class)
        return dict(cache[src_cfg_class])

    factory._get_field_docstrings = read_once


def _padding(lm: bool):
    """The framework's own padding function (see the module docstring)."""
    if not lm:
        return importlib.import_module("megatron.tokenizer.tokenizer")._vocab_size_with_padding
    try:
        return importlib.import_module("megatron.core.tokenizers.utils.build_tokenizer").vocab_size_with_padding
    except ImportError:
        return importlib.import_module("megatron.training.tokenizer.tokenizer")._vocab_size_with_padding


if __name__ == "__main__":
    drive()
