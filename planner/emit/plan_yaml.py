"""plantune's ``plan.yaml``: a plan in Megatron's own argparse destination names, read back losslessly.

Top-level keys are the ``dest`` names of Megatron's arguments (``tensor_model_parallel_size``,
``micro_batch_size``, ``rampup_batch_size: [S, I, N]``, ``recompute_granularity``, ...) plus
DeepSpeed's ``gradient_accumulation_steps``; everything only plantune knows sits under
``plantune:`` (target, the rest of the model, the cluster, the prediction).

    >>> from planner.emit import load_plan_yaml, plan_yaml_dict
    >>> # plan_yaml_dict(load_plan_yaml(path)) == yaml.safe_load(open(path))   (round trip)
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import yaml

from planner import recompute as recompute_modes
from planner.attention import check_kernel
from planner.errors import InputError, PlantuneError
from planner.files import read_mapping
from planner.hardware import accelerator_from, accelerator_ref, make_cluster
from planner.model import ModelSpec, Rampup, model_to_yaml_dict, positions_note
from planner.schema import (CALIBRATION, CLUSTER, MAX_GLOBAL_BATCH, MAX_GPUS, MAX_MBS, MODEL, RAMPUP, WHY_GLOBAL_BATCH,
                            WHY_GPUS, Bool, Enum, Field, Int, List, Map, Num, Scalar, Str, check, check_training)
from planner.space import FLAVORS, FRAMEWORKS, FSDP_TRAINERS, OPTIMIZERS, Candidate, TrainingSpec

from planner.emit.setup import Prediction, RunSetup, train_samples

# ModelSpec fields written at the top level under Megatron's names (the rest go to plantune.model).
_SHAPE = {"layers": "num_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
          "kv_heads": "num_key_value_heads", "ffn_hidden": "ffn_hidden_size"}
# max_position_embeddings is the model's positions (what the emitted --max-position-embeddings says: a config.json's
# own); the model's default training length (seq_len) and its max_positions are plantune.model's
# TrainingSpec fields written at the top level; every other field goes to plantune.training (tuples as lists).
_TRAINING_TOP = {"global_batch", "seq_len", "precision", "rampup", "flash_attention"}
# flavor is plantune.flavor; pins and offload_search only narrow the search and mean nothing once a layout is chosen
_TRAINING_NOT_WRITTEN = {"flavor", "pins", "offload_search"}
_OPTIONAL = {"attention_kernel", "eager_ops", "cuda_graphs", "fsdp_trainer"}
"""plantune.training keys files written before them may lack (the TrainingSpec default applies)"""
_TRAINING_EXTRA = tuple(f.name for f in fields(TrainingSpec) if f.name not in _TRAINING_TOP | _TRAINING_NOT_WRITTEN)


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):
    """Block mappings, flow lists (``rampup_batch_size: [192, 16, 9765625]``); read back by yaml.safe_load. SafeDumper's
    representers on libyaml's emitter where PyYAML has it (~8x faster; the same text on every file test_rulebook,
    test_emit and the README examples write, checked 2026-11-29)."""


_Dumper.add_representer(list, lambda dumper, data: dumper.represent_sequence(
    "tag:yaml.org,2002:seq", data, flow_style=True))


# -- the plan file's schema (planner.schema's field types) ---------------------------------------------------
def required_field(f: Field) -> Field:
    return replace(f, required=True)


def plan_schema() -> dict[str, Field]:
    """plantune plan.yaml (planner.emit.plan_yaml): Megatron's names at the top, plantune's under ``plantune:``."""
    size = Int(1, MAX_GPUS, why=WHY_GPUS, required=True)
    batch = Int(1, MAX_GLOBAL_BATCH, why=WHY_GLOBAL_BATCH, required=True)
    model_rest = {k: v for k, v in MODEL.items()
                  if k not in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden")}
    model_rest["name"] = Str()
    training = {
        "optimizer": Enum(*OPTIMIZERS), "framework": Enum(*FRAMEWORKS),
        "memory_fraction": Num(0, 1, open_lo=True), "memory_headroom": Num(0, 0.99),
        "train_tokens": MODEL["train_tokens"], "max_mbs": Int(1, MAX_MBS),
        "recompute_options": List(Str()), "zero_options": List(Enum(0, 1, 2, 3)),   # TrainingSpec checks the modes
        # --cp / --ep lists and --overlap (TrainingSpec checks them); null when not given
        "cp_options": List(Int(1, MAX_GPUS), null=True), "ep_options": List(Int(1, MAX_GPUS), null=True),
        "overlap": List(Str(), null=True), "optimizer_offload": Num(0, 1),
        "activation_offload": List(Str()),   # TrainingSpec checks the module names
        "cuda_graphs": List(Str()),   # TrainingSpec checks the scopes (planner.cuda_graphs)
        "fsdp_trainer": Enum(*FSDP_TRAINERS),
    }
    cluster = {**CLUSTER, "gpus_per_node": required_field(CLUSTER["gpus_per_node"]), "nodes": required_field(CLUSTER["nodes"]),
               "matmul_efficiency": CALIBRATION["matmul_efficiency"],
               "elementwise_efficiency": CALIBRATION["elementwise_efficiency"],
               "attention_efficiency": CALIBRATION["attention_efficiency"],
               "host_scale": Num(0, 1000, open_lo=True, what="a multiple of the fitted host time in (0, 1000]"),
               "cuda_context_bytes": CALIBRATION["cuda_context_bytes"]}
    prediction = {k: Num(0, required=True) for k in ("memory_gb_per_gpu", "step_time_s", "model_tflops_per_gpu",
                                                      "hardware_tflops_per_gpu")}
    prediction["mfu"] = Num(0, 1, required=True)
    return {
        "num_layers": required_field(MODEL["layers"]), "hidden_size": required_field(MODEL["hidden"]),
        "num_attention_heads": required_field(MODEL["heads"]), "num_key_value_heads": required_field(MODEL["kv_heads"]),
        "ffn_hidden_size": required_field(MODEL["ffn_hidden"]), "max_position_embeddings": MODEL["seq_len"],
        "seq_length": MODEL["seq_len"],
        "tensor_model_parallel_size": size, "pipeline_model_parallel_size": size, "data_parallel_size": size,
        "context_parallel_size": size, "expert_model_parallel_size": size, "expert_tensor_parallel_size": size,
        "fp8": Enum(None, "hybrid", "e4m3", what="null, hybrid or e4m3 (Megatron's --fp8-format)"),
        "num_virtual_stages_per_pipeline_rank": Int(2, 10_000, null=True),
        "sequence_parallel": Bool(required=True),
        "micro_batch_size": batch, "global_batch_size": batch, "gradient_accumulation_steps": batch,
        "rampup_batch_size": replace(RAMPUP, what="[START, INCREMENT, SAMPLES] integers", required=True),
        "train_samples": Int(1, None, null=True),
        "recompute_granularity": Enum(None, "full", "selective",
                                      what="null, full or selective (Megatron's --recompute-granularity)"),
        "recompute_method": Enum(None, "uniform", "block", what="null, uniform or block (Megatron's --recompute-method)"),
        "recompute_num_layers": Int(1, None, null=True),
        "recompute_modules": List(Str()),   # Megatron's --recompute-modules (plantune.recompute says the mode)
        "zero_stage": Enum(0, 1, 2, 3),
        "bf16": Bool(required=True), "fp16": Bool(required=True), "use_flash_attn": Bool(required=True),
        "plantune": Map({
            "kind": Enum(*FRAMEWORKS, required=True), "flavor": Enum(None, *FLAVORS),
            "hybrid_shard": Bool(required=True),
            "recompute": Str(),   # planner.recompute's mode (torchtitan's selective-op / selective-layer-N too)
            "model": Map(model_rest, required=True),
            "training": Map(training, required=True),
            "cluster": Map(cluster, required=True),
            "prediction": Map(prediction, null=True),
        }, required=True),
    }


def check_plan(data: dict, where: str) -> dict:
    """A plan.yaml mapping, checked; fields other modules add to ModelSpec / TrainingSpec pass as plain values."""
    schema = plan_schema()
    p = dict(schema["plantune"].sub or {})
    model, training = dict(p["model"].sub or {}), dict(p["training"].sub or {})
    top = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden")
    model.update({f.name: Scalar() for f in fields(ModelSpec) if f.name not in model and f.name not in top})
    training.update({f.name: Scalar() for f in fields(TrainingSpec) if f.name not in training and f.name not in
                     ("global_batch", "seq_len", "precision", "rampup", "flash_attention")})
    p["model"], p["training"] = Map(model, required=True), Map(training, required=True)
    check(data, {**schema, "plantune": Map(p, required=True)}, where)
    for key, gbs in (("rampup_batch_size", data["global_batch_size"]),
                     ("plantune.model.rampup", data["plantune"]["model"].get("global_batch"))):
        ramp = data.get("rampup_batch_size") if key == "rampup_batch_size" else data["plantune"]["model"].get("rampup")
        if ramp and gbs:
            check_training(gbs, Rampup(start=ramp[0], increment=ramp[1], samples=ramp[2]), f"{where}: {key}")
    return data



def dump_yaml(data: dict) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


def _cluster_dict(setup: RunSetup) -> dict:
    cl = setup.cluster
    d = {"name": cl.name, "gpu": accelerator_ref(cl.gpu), "gpus_per_node": cl.gpus_per_node, "nodes": cl.nodes,
         "inter_node_gbps": round(cl.inter_node_bw_bytes_per_s * 8 / 1e9, 3),
         "intra_node_gbps": round(cl.intra_node_bw_bytes_per_s * 8 / 1e9, 3)}
    if cl.nvlink_domain:
        d["nvlink_domain"] = cl.nvlink_domain
    if cl.matmul_efficiency is not None:
        d["matmul_efficiency"] = cl.matmul_efficiency
    for name in ("elementwise_efficiency", "attention_efficiency"):   # timed by tune calibrate
        if getattr(cl, name) is not None:
            d[name] = getattr(cl, name)
    if cl.host_scale != 1.0:
        d["host_scale"] = cl.host_scale
    if cl.cuda_context_bytes is not None:
        d["cuda_context_bytes"] = cl.cuda_context_bytes
    return d


def plan_yaml_dict(setup: RunSetup, *, kind: str = "megatron-deepspeed", flavor: str | None = "bigscience") -> dict:
    """The plan.yaml mapping (key order as written). ``flavor`` only means something for megatron-deepspeed."""
    m, c, t = setup.model, setup.candidate, setup.training
    model_rest = {k: v for k, v in model_to_yaml_dict(m).items() if k not in _SHAPE}
    return {
        "num_layers": m.layers,
        "hidden_size": m.hidden,
        "num_attention_heads": m.heads,
        "num_key_value_heads": m.kv_heads,
        "ffn_hidden_size": m.ffn_hidden,
        "seq_length": t.seq_len,
        "max_position_embeddings": m.positions,
        "tensor_model_parallel_size": c.tp,
        "pipeline_model_parallel_size": c.pp,
        "data_parallel_size": c.dp,
        "context_parallel_size": c.cp,
        "expert_model_parallel_size": c.ep,
        "expert_tensor_parallel_size": c.etp,
        "num_virtual_stages_per_pipeline_rank": c.vpp if c.vpp > 1 else None,
        "sequence_parallel": c.sp,
        "micro_batch_size": c.mbs,
        "global_batch_size": t.global_batch,
        "gradient_accumulation_steps": c.gas,
        "rampup_batch_size": t.rampup.as_list() if t.rampup else None,
        "train_samples": train_samples(t),
        **recompute_modes.plan_yaml_fields(c.recompute),
        "zero_stage": c.zero,
        "bf16": t.precision in ("bf16", "fp8"),
        "fp16": t.precision == "fp16",
        "fp8": "hybrid" if t.precision == "fp8" else None,   # Megatron's --fp8-format dest (planner.fp8)
        "use_flash_attn": t.flash_attention,
        "plantune": {
            "kind": kind,
            "flavor": flavor if kind == "megatron-deepspeed" else None,
            "hybrid_shard": c.hybrid,
            "recompute": c.recompute,
            "model": model_rest,
            "training": {k: list(v) if isinstance(v, tuple) else v
                         for k in _TRAINING_EXTRA for v in [getattr(t, k)] if k not in _OPTIONAL or v},
            "cluster": _cluster_dict(setup),
            "prediction": ({f.name: getattr(setup.prediction, f.name) for f in fields(Prediction)}
                           if setup.prediction else None),
        },
    }


def plan_yaml_text(setup: RunSetup, *, kind: str, flavor: str | None) -> str:
    lines = ["plantune plan: Megatron argparse destination names at the top level, plantune-only facts under "
             "'plantune:'.",
             "recompute_granularity null|full|selective, recompute_method uniform|block with recompute_num_layers N "
             "(Megatron's partial recompute; the Megatron-DeepSpeed forks spell full as --checkpoint-activations); "
             "plantune.recompute: plantune's mode (torchtitan's selective-op / selective-layer-N).",
             "Read back with planner.emit.load_plan_yaml; regenerate rather than edit by hand."]
    raised = positions_note(setup.model)
    if raised:
        lines.append(raised)
    if kind == "megatron-deepspeed" and flavor == "bigscience" and setup.training.precision == "bf16":
        lines.append(f"zero_stage {setup.candidate.zero} is the planned sharding: the bigscience fork's bf16 optimizer "
                     "(ZeRO-1-like) runs with stage 0 in ds_config.json.")
    return "".join(f"# {line}\n" for line in lines) + dump_yaml(plan_yaml_dict(setup, kind=kind, flavor=flavor))


# -- reading ---------------------------------------------------------------------------------------------------

def _need(d: dict, key: str, where: str, typ: type | tuple[type, ...], path: Path) -> object:
    """d[key], type-checked (a YAML bool never passes for a number); InputError naming the key otherwise."""
    if not isinstance(d, dict) or key not in d:
        raise InputError(f"plan file {path}: missing key {where}{key}; regenerate it with `plan --emit`")
    value, types = d[key], typ if isinstance(typ, tuple) else (typ,)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        names = "/".join("null" if x is type(None) else x.__name__ for x in types)
        raise InputError(f"plan file {path}: {where}{key} must be {names}, got {value!r}")
    return value


def load_plan_yaml(path: Path) -> RunSetup:
    """plan.yaml -> RunSetup (yaml.safe_load only); InputError naming the key when malformed or incomplete."""
    path = Path(path)
    d = check_plan(read_mapping(path, "plan file", missing_hint="; write one with `plan ... --emit DIR`"),
                   f"plan file {path}")
    num = (int, float)
    p = _need(d, "plantune", "", dict, path)
    pm = _need(p, "model", "plantune.", dict, path)
    pt = _need(p, "training", "plantune.", dict, path)
    pc = _need(p, "cluster", "plantune.", dict, path)
    try:
        rampup_list = _need(d, "rampup_batch_size", "", (list, type(None)), path)
        if rampup_list is not None and (len(rampup_list) != 3 or not all(isinstance(v, int) for v in rampup_list)):
            raise InputError(f"plan file {path}: rampup_batch_size must be [START, INCREMENT, SAMPLES] integers")
        rampup = Rampup(start=rampup_list[0], increment=rampup_list[1], samples=rampup_list[2]) if rampup_list else None
        model_rampup = pm.get("rampup")
        model = ModelSpec(
            layers=_need(d, "num_layers", "", int, path), hidden=_need(d, "hidden_size", "", int, path),
            heads=_need(d, "num_attention_heads", "", int, path),
            kv_heads=_need(d, "num_key_value_heads", "", int, path),
            ffn_hidden=_need(d, "ffn_hidden_size", "", int, path),
            # plan files before issue 31 wrote the model's seq_len as max_position_embeddings
            seq_len=pm["seq_len"] if "seq_len" in pm else _need(d, "max_position_embeddings", "", int, path),
            **{k: v for k, v in pm.items() if k not in ("rampup", "seq_len")},
            rampup=Rampup(start=model_rampup[0], increment=model_rampup[1], samples=model_rampup[2])
            if model_rampup else None)
        if _need(d, "max_position_embeddings", "", int, path) != model.positions:
            raise InputError(f"plan file {path}: max_position_embeddings {d['max_position_embeddings']} disagrees with "
                             f"the model's {model.positions} positions (plantune.model max_positions / seq_len); "
                             "regenerate it with `plan --emit`")
        bf16, fp16 = _need(d, "bf16", "", bool, path), _need(d, "fp16", "", bool, path)
        if bf16 and fp16:
            raise InputError(f"plan file {path}: bf16 and fp16 are both true; keep one")
        flavor = p.get("flavor") or "bigscience"
        if p.get("kind") == "megatron-deepspeed" and flavor not in ("bigscience", "microsoft"):
            raise InputError(f"plan file {path}: plantune.flavor {flavor!r} is not bigscience or microsoft")
        training = TrainingSpec(
            global_batch=_need(d, "global_batch_size", "", int, path), seq_len=_need(d, "seq_length", "", int, path),
            flavor=flavor if p.get("kind") == "megatron-deepspeed" else "bigscience",
            precision="fp8" if _need(d, "fp8", "", (str, type(None)), path) else "bf16" if bf16 else "fp16" if fp16
            else "fp32", rampup=rampup,
            flash_attention=_need(d, "use_flash_attn", "", bool, path),
            **{k: tuple(v) if isinstance(v, list) else v for k in _TRAINING_EXTRA if k in pt or k not in _OPTIONAL
               for v in [_need(pt, k, "plantune.training.", (str, int, float, bool, list, type(None)), path)]})
        if training.attention_kernel:
            check_kernel(training.attention_kernel, f"plan file {path}: plantune.training.attention_kernel")
        samples = _need(d, "train_samples", "", (int, type(None)), path)
        if samples != train_samples(training):
            raise InputError(f"plan file {path}: train_samples {samples} disagrees with plantune.training.train_tokens"
                             f" / seq_length = {train_samples(training)}; change train_tokens instead")
        pp = _need(d, "pipeline_model_parallel_size", "", int, path)
        if "num_layers_per_virtual_pipeline_stage" in d:  # plan files written before uneven stages
            layers_per_virtual = _need(d, "num_layers_per_virtual_pipeline_stage", "", (int, type(None)), path)
            if layers_per_virtual is not None and (layers_per_virtual <= 0 or model.layers % (pp * layers_per_virtual)):
                raise InputError(f"plan file {path}: num_layers_per_virtual_pipeline_stage {layers_per_virtual} does "
                                 f"not split {model.layers} layers over {pp} pipeline stages")
            vpp = model.layers // (pp * layers_per_virtual) if layers_per_virtual else 1
        else:
            vpp = _need(d, "num_virtual_stages_per_pipeline_rank", "", (int, type(None)), path) or 1
            if vpp < 1:
                raise InputError(f"plan file {path}: num_virtual_stages_per_pipeline_rank must be >= 1, got {vpp}")
        recompute = p.get("recompute") or recompute_modes.from_plan_yaml(
            _need(d, "recompute_granularity", "", (str, type(None)), path), d.get("recompute_method"),
            d.get("recompute_num_layers"))
        if not recompute_modes.is_valid(recompute):
            raise InputError(f"plan file {path}: plantune.recompute {recompute!r} is no recompute mode; use one of "
                             f"{', '.join(recompute_modes.OPTIONS)} (block-N, uniform-N, selective-layer-N with N)")
        candidate = Candidate(
            tp=_need(d, "tensor_model_parallel_size", "", int, path), pp=pp,
            dp=_need(d, "data_parallel_size", "", int, path), mbs=_need(d, "micro_batch_size", "", int, path),
            gas=_need(d, "gradient_accumulation_steps", "", int, path), recompute=recompute,
            zero=_need(d, "zero_stage", "", int, path), sp=_need(d, "sequence_parallel", "", bool, path),
            vpp=vpp,
            hybrid=_need(p, "hybrid_shard", "plantune.", bool, path),
            cp=_need(d, "context_parallel_size", "", int, path), ep=_need(d, "expert_model_parallel_size", "", int, path),
            etp=_need(d, "expert_tensor_parallel_size", "", int, path))
        gpu = accelerator_from(_need(pc, "gpu", "plantune.cluster.", (str, dict), path),
                               f"plan file {path}: plantune.cluster.gpu")
        cluster = make_cluster(gpu=gpu,
                               gpus_per_node=_need(pc, "gpus_per_node", "plantune.cluster.", int, path),
                               nodes=_need(pc, "nodes", "plantune.cluster.", int, path),
                               inter_node_gbps=_need(pc, "inter_node_gbps", "plantune.cluster.", num, path),
                               intra_node_gbps=_need(pc, "intra_node_gbps", "plantune.cluster.", num, path),
                               name=_need(pc, "name", "plantune.cluster.", str, path),
                               nvlink_domain=pc.get("nvlink_domain"))
        cluster = replace(cluster, matmul_efficiency=pc.get("matmul_efficiency"),
                          elementwise_efficiency=pc.get("elementwise_efficiency"),
                          attention_efficiency=pc.get("attention_efficiency"),
                          host_scale=float(pc.get("host_scale", 1.0)), cuda_context_bytes=pc.get("cuda_context_bytes"))
        # The file's degrees must agree with its own cluster and batch (hand edits can break that): a layout
        # whose DP is not GPUs / (TP x PP x CP) is no launchable setup, so it is refused here, not "RULED OUT".
        if candidate.world != cluster.world_size:
            rest = candidate.tp * candidate.pp * candidate.cp
            cp = f" x CP {candidate.cp}" if candidate.cp > 1 else ""
            fix = (f"data_parallel_size {cluster.world_size // rest}" if cluster.world_size % rest == 0 else
                   "degrees whose product divides the GPUs")
            raise InputError(f"plan file {path}: data_parallel_size {candidate.dp} disagrees with its "
                             f"{cluster.world_size} GPUs ({cluster.nodes} nodes x {cluster.gpus_per_node}) / (TP "
                             f"{candidate.tp} x PP {candidate.pp}{cp}); set {fix}, or regenerate it with "
                             "`plan --emit`")
        if candidate.global_batch != training.global_batch:
            unit = candidate.mbs * candidate.dp
            fix = (f"gradient_accumulation_steps {training.global_batch // unit}" if training.global_batch % unit == 0
                   else f"a global_batch_size that is a multiple of micro_batch_size x DP = {unit}")
            raise InputError(f"plan file {path}: micro_batch_size {candidate.mbs} x DP {candidate.dp} x "
                             f"gradient_accumulation_steps {candidate.gas} = {candidate.global_batch} disagrees with "
                             f"global_batch_size {training.global_batch}; set {fix}")
        pred = p.get("prediction")
        prediction = None if pred is None else Prediction(
            **{f.name: float(_need(pred, f.name, "plantune.prediction.", num, path)) for f in fields(Prediction)})
    except PlantuneError as err:
        if str(err).startswith("plan file"):
            raise
        raise InputError(f"plan file {path}: {err}") from None
    except (TypeError, IndexError) as err:
        raise InputError(f"plan file {path}: {err}; regenerate it with `plan --emit`") from None
    return RunSetup(model=model, cluster=cluster, training=training, candidate=candidate, prediction=prediction)


def plan_target(path: Path) -> tuple[str, str | None]:
    """(kind, flavor) a plan.yaml was emitted for."""
    p = read_mapping(path, "plan file").get("plantune")
    if not isinstance(p, dict) or "kind" not in p:
        raise InputError(f"plan file {path}: missing plantune.kind; regenerate it with `plan --emit`")
    return p["kind"], p.get("flavor")


__all__ = ["dump_yaml", "load_plan_yaml", "plan_target", "plan_yaml_dict", "plan_yaml_text"]
