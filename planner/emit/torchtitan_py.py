"""FSDP for torchtitan 0.3.0 (what `pip install torchtitan` gives): a Python config module and its launcher.

torchtitan 0.3.0 has no TOML: a job is a function returning ``Trainer.Config`` in a module that
``torchtitan.train`` loads with ``--module <module> --config <function>`` (torchtitan/config/manager.py
ConfigManager._load_config; a module name outside torchtitan is imported as given), CLI ``--section.key value``
overriding it (tyro). Class and field names are torchtitan 0.3.0's (PyPI wheel): trainer.py Trainer.Config,
config/configs.py TrainingConfig / ParallelismConfig / CompileConfig (async TP moved to
``compile.enable_async_tensor_parallel``), distributed/activation_checkpoint.py FullAC / SelectiveAC (per-op
only: no layer-wise selective AC), components/quantization/float8.py Float8LinearConverter (recipe_name rowwise |
rowwise_with_gw_hp: no tensorwise), hf_datasets/text_datasets.py HuggingFaceTextDataLoader, models/llama3
model_registry and llama3_configs (the flavors). A model that is not one of torchtitan's llama3 flavors is built in
the module from torchtitan's own llama3 layer builder and registered as flavor "plantune" (no source patch).
tests/test_torchtitan3_parser.py loads the emitted module through 0.3.0's ConfigManager (build/torchtitan-0.3.0).
The mesh, schedule, batch and learning-rate values are `planner.emit.fsdp`'s, shared with the 0.2.2 TOML.
"""

from __future__ import annotations

from planner import recompute as recompute_modes
from planner.emit import facts, fsdp
from planner.emit.setup import RunSetup, one_line, train_samples
from planner.errors import InputError
from planner.framework import TORCHTITAN_VERSIONS

VERSION = TORCHTITAN_VERSIONS[0]
MODULE = "plantune_torchtitan"
FILE_NAME = f"{MODULE}.py"
CONFIG_FN = "plantune"
"""the config function ``--config`` names"""
CUSTOM = fsdp.CUSTOM_FLAVOR
FP8_RECIPES = ("rowwise",)
"""plantune's --fp8-recipe values 0.3.0's Float8LinearConverter has (tensorwise went with 0.3.0)"""
OVERRIDES = {"DATASET": "--dataloader.dataset", "DATASET_PATH": "--dataloader.dataset_path",
             "HF_ASSETS_PATH": "--hf_assets_path"}
"""launcher environment -> the CLI override that replaces the module's placeholder"""


def problems(setup: RunSetup) -> list[str]:
    """What 0.3.0 cannot run of this setup, each with its fix."""
    t, c, m = setup.training, setup.candidate, setup.model
    out = []
    if t.precision == "fp8" and t.fp8_recipe not in FP8_RECIPES:
        out.append(f"torchtitan {VERSION}'s float8 has recipes rowwise and rowwise_with_gw_hp, not "
                   f"{t.fp8_recipe} (use --fp8-recipe rowwise, or --torchtitan-version 0.2.2)")
    mode = recompute_modes.parse(c.recompute)
    if mode is not None and mode.kind == "selective-layer":
        out.append(f"torchtitan {VERSION} has per-op selective activation checkpointing only, not {c.recompute} "
                   "(use --recompute selective or full, or --torchtitan-version 0.2.2)")
    if m.rope_scaling not in ("", "llama3"):
        out.append(f"torchtitan {VERSION}'s llama3 RoPE has Llama 3.1 scaling only, not {m.rope_scaling} "
                   "(emit megatron-lm for this model)")
    return out


def _ac(setup: RunSetup) -> str:
    """The activation_checkpoint policy (one mapping: `planner.recompute.torchtitan_activation_checkpoint`)."""
    mode = recompute_modes.torchtitan_activation_checkpoint(setup.candidate.recompute)["mode"]
    return {"full": "FullAC.Config()", "selective": "SelectiveAC.Config()", "none": "None"}[mode]


def _call(name: str, kw: dict, indent: int) -> str:
    pad = " " * indent
    return f"{name}(\n" + "".join(f"{pad}    {k}={v},\n" for k, v in kw.items()) + f"{pad})"


def _model_lines(setup: RunSetup) -> list[str]:
    """The custom flavor: torchtitan's llama3 builder with this model's sizes (facts.torchtitan_model_args;
    untied embeddings, as the rulebook requires of fsdp)."""
    a = fsdp.model_args(setup.model)
    rope = {"dim": a.dim // a.n_heads, "max_seq_len": a.max_seq_len, "theta": a.rope_theta,
            "scaling": "llama" if setup.model.rope_scaling == "llama3" else "none"}
    if rope["scaling"] == "llama":
        rope |= a.rope_scaling_args
    layers = {"n_layers": a.n_layers, "dim": a.dim, "n_heads": a.n_heads, "n_kv_heads": a.n_kv_heads,
              "hidden_dim": a.ffn_hidden, "fuse_qkv": True,
              "rope": "ComplexRoPE.Config(" + ", ".join(f"{k}={v!r}" for k, v in rope.items()) + ")",
              "attn_backend": "attn_backend", "tp_gemm_backend": "tp_gemm_backend"}
    layers = {k: (v if k in ("rope", "attn_backend", "tp_gemm_backend") else repr(v)) for k, v in layers.items()}
    return [
        "",
        "",
        f"def _{CUSTOM}(attn_backend: str, tp_gemm_backend: str = \"default\") -> llama3.Llama3Model.Config:",
        f'    """{one_line(setup.model.name)}: FFN width {a.ffn_hidden}, RMSNorm eps {a.norm_eps}."""',
        "    config = " + _call("llama3.Llama3Model.Config", {
            "dim": a.dim, "vocab_size": a.vocab_size,
            "tok_embeddings": f"Embedding.Config(num_embeddings={a.vocab_size}, embedding_dim={a.dim}, "
                              "param_init=llama3._EMBEDDING_INIT)",
            "norm": f"RMSNorm.Config(normalized_shape={a.dim}, param_init=llama3._NORM_INIT)",
            "lm_head": f"Linear.Config(in_features={a.dim}, out_features={a.vocab_size}, "
                       f"param_init=llama3._output_linear_init({a.dim}))",
            "layers": _call("llama3._build_llama3_layers", layers, 8)}, 4),
        f"    for norm in [config.norm] + [n for b in config.layers for n in (b.attention_norm, b.ffn_norm)]:",
        f"        norm.eps = {a.norm_eps!r}",
        "    return config",
        "",
        "",
        f'llama3.llama3_configs["{CUSTOM}"] = _{CUSTOM}',
    ]


def _parallelism(setup: RunSetup) -> dict:
    return {k: v for k, v in fsdp.parallelism(setup).items() if k != "enable_async_tensor_parallel"}


def config_text(setup: RunSetup) -> str:
    """``plantune_torchtitan.py``: the module whose ``plantune()`` is the job's Trainer.Config."""
    m, c, t = setup.model, setup.candidate, setup.training
    d = fsdp.torchtitan_dict(setup)   # the values both versions share, under 0.2.2's section names
    flavor = fsdp.LLAMA3_FLAVORS.get(m.name, CUSTOM)
    tr, lr, opt = d["training"], d["lr_scheduler"], d["optimizer"]
    compile_on = t.torch_compile or t.async_tp   # async TP is a compile pass in 0.3.0
    converters = ""
    if t.precision == "fp8":
        converters = (f"converters=[Float8LinearConverter.Config(recipe_name={t.fp8_recipe!r}, "
                      f"model_compile_enabled={compile_on})]")
    training = {k: repr(tr[k]) for k in ("local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps",
                                         "mixed_precision_param", "mixed_precision_reduce")}
    if c.pp > 1 or c.ep > 1:   # Trainer.Config._validate_cuda_graphs: no CUDA graphs under PP (nor host-synced EP)
        training["disable_cuda_graphs"] = "True"
    trainer = {
        "loss": "ChunkedLossWrapper.Config(\n            loss_fn=CrossEntropyLoss.Config("
                "global_vocab_size=decoder_vocab_size(model_spec)),\n        )",
        "hf_assets_path": repr(f"{fsdp.PLACEHOLDER}HF_ASSETS_PATH"),
        "dump_folder": repr(d["job"]["dump_folder"]),
        "metrics": _call("MetricsProcessor.Config", {k: repr(v) for k, v in d["metrics"].items()}, 8),
        "model_spec": "model_spec",
        "optimizer": f"default_adamw(lr={opt['lr']!r}, eps={opt['eps']!r}, weight_decay={opt['weight_decay']!r})",
        "lr_scheduler": _call("LRSchedulersContainer.Config", {k: repr(v) for k, v in lr.items()}, 8),
        "training": _call("TrainingConfig", training, 8),
        "dataloader": _call("HuggingFaceTextDataLoader.Config", {k: repr(tr[k]) for k in ("dataset", "dataset_path")},
                            8),
        "parallelism": _call("ParallelismConfig", {k: repr(v) for k, v in _parallelism(setup).items()}, 8),
        "checkpoint": _call("CheckpointManager.Config", {k: repr(v) for k, v in d["checkpoint"].items()}, 8),
        "activation_checkpoint": _ac(setup),
        "compile": _call("CompileConfig", {"enable": repr(compile_on), "components": repr(["model", "loss"]),
                                           "enable_async_tensor_parallel": repr(t.async_tp)}, 8),
    }
    head = [f'"""torchtitan {VERSION} job for {one_line(m.name)}, written by plantune: FSDP {c.fsdp_strategy}, '
            f"DP={c.dp}, TP={c.tp}, PP={c.pp}, CP={c.cp},",
            f"MBS={c.mbs}, GAS={c.gas}, recompute {c.recompute}. Start it with ./{fsdp.LAUNCHER}, which runs",
            f"python -m torchtitan.train --module {MODULE} --config {CONFIG_FN}",
            f"and replaces the {fsdp.PLACEHOLDER}* values from its environment (command-line overrides).",
            facts.vocab_note(m, c.tp, "torchtitan")]
    if train_samples(t) is None:
        head.append(f"No token budget was given: ./{fsdp.LAUNCHER} asks for TRAIN_STEPS (--training.steps).")
    lines = [*head, '"""', "",
             "from torchtitan.components.checkpoint import CheckpointManager",
             "from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss",
             "from torchtitan.components.metrics import MetricsProcessor",
             "from torchtitan.components.optimizer import default_adamw, LRSchedulersContainer",
             *(["from torchtitan.components.quantization import Float8LinearConverter"] if converters else []),
             "from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig",
             "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
             "from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader",
             "from torchtitan.models import llama3",
             *(["from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm"]
               if flavor == CUSTOM else []),
             "from torchtitan.models.common.config_utils import decoder_vocab_size",
             "from torchtitan.trainer import Trainer"]
    if flavor == CUSTOM:
        lines += _model_lines(setup)
    lines += ["", "", f"def {CONFIG_FN}() -> Trainer.Config:",
              f"    model_spec = llama3.model_registry({flavor!r}{', ' + converters if converters else ''})",
              "    return " + _call("Trainer.Config", trainer, 4), ""]
    return "\n".join(lines)


def launcher_text(setup: RunSetup) -> str:
    """``launch_torchtitan.sh`` for 0.3.0: the module and its function, the placeholders replaced by CLI
    overrides (the command line wins over the config function: ConfigManager.parse_args)."""
    prepare = ["# DATASET_PATH none: load the dataset by name (dataset_path None)",
               'if [ "$DATASET_PATH" = none ]; then DATASET_PATH=None; fi',
               "export DATASET DATASET_PATH HF_ASSETS_PATH"]
    args = " ".join(f'{flag} "${env}"' for env, flag in OVERRIDES.items())
    return fsdp.launcher_lines(setup, VERSION, prepare, f"--module {MODULE} --config {CONFIG_FN} {args}")


def files(setup: RunSetup) -> dict[str, str]:
    bad = problems(setup)
    if bad:
        raise InputError(f"cannot emit fsdp (torchtitan {VERSION}): " + "; ".join(bad))
    return {FILE_NAME: config_text(setup), fsdp.LAUNCHER: launcher_text(setup)}


__all__ = ["CONFIG_FN", "FILE_NAME", "MODULE", "OVERRIDES", "VERSION", "config_text", "files", "launcher_text",
           "problems"]
