"""CP / EP / MoE / MLA / FP8 in the emitters: every name is Megatron-LM's or torchtitan's, the flags parse,
plan.yaml round-trips, and what a target cannot run is refused with the planner's reason.

Names transcribed (names and arity only) from:
- NVIDIA/Megatron-LM megatron/training/arguments.py at commit c56b78489c309ce5e306637f3f36f52992d9fd56
  (``_add_distributed_args``: --context-parallel-size, --cp-comm-type; ``_add_moe_args``;
  ``_add_mla_args``; ``_add_transformer_engine_args``: --fp8-format (dest fp8), --fp8-recipe,
  --fp8-amax-history-len, --fp8-amax-compute-algo; ``_add_network_size_args``: --use-rope-scaling,
  --rope-scaling-factor);
- the same commit's megatron/core/transformer/transformer_config.py (TransformerConfig,
  MLATransformerConfig) and megatron/core/model_parallel_config.py (ModelParallelConfig) field names,
  which ``--yaml-cfg`` (megatron/training/yaml_arguments.py) reads from ``language_model:`` and
  ``model_parallel:``;
- pytorch/torchtitan v0.2.2 (73a0e6979dd10b6b1904098eb3c8f62c18ab87ce) torchtitan/config/job_config.py and
  components/quantization/float8.py (converter "quantize.linear.float8").
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest
import yaml

from planner.emit import RunSetup, load_plan_yaml, render
from planner.emit.parallel_extras import megatron_lm_flags
from planner.errors import InputError
from planner.hardware import make_cluster
from planner.model import get_preset
from planner.space import Candidate, TrainingSpec

# flag -> takes a value (True) or is store_true (False)
MEGATRON_FLAGS = {
    "--context-parallel-size": True, "--cp-comm-type": True,
    "--expert-model-parallel-size": True, "--expert-tensor-parallel-size": True, "--num-experts": True,
    "--moe-layer-freq": True, "--moe-ffn-hidden-size": True, "--moe-shared-expert-intermediate-size": True,
    "--moe-grouped-gemm": False, "--moe-router-topk": True, "--moe-router-load-balancing-type": True,
    "--moe-token-dispatcher-type": True, "--moe-expert-capacity-factor": True,
    "--moe-pad-expert-input-to-capacity": False, "--moe-flex-dispatcher-backend": True,
    "--multi-latent-attention": False, "--q-lora-rank": True, "--kv-lora-rank": True, "--qk-head-dim": True,
    "--qk-pos-emb-head-dim": True, "--v-head-dim": True, "--kv-channels": True,
    "--fp8-format": True, "--fp8-recipe": True, "--fp8-amax-history-len": True, "--fp8-amax-compute-algo": True,
    "--fp8-param-gather": False,
    "--use-rope-scaling": False, "--rope-scaling-factor": True,
    # the router as the model trained it (planner.emit.parallel_extras.router_flags): TransformerConfig fields
    # moe_aux_loss_coeff (arguments.py literal), moe_router_score_function, moe_router_pre_softmax,
    # moe_router_topk_scaling_factor, moe_router_num_groups, moe_router_group_topk, moe_router_enable_expert_bias,
    # moe_shared_expert_gate (megatron-core 0.17.1, built into flags by ArgumentGroupFactory); MLA's YaRN
    # (_add_mla_args: --rotary-scaling-factor, --mscale, --mscale-all-dim)
    "--moe-aux-loss-coeff": True, "--moe-router-score-function": True, "--moe-router-pre-softmax": False,
    "--moe-router-topk-scaling-factor": True, "--moe-router-num-groups": True, "--moe-router-group-topk": True,
    "--moe-router-enable-expert-bias": False, "--moe-shared-expert-gate": False, "--rotary-scaling-factor": True,
    "--mscale": True, "--mscale-all-dim": True, "--rotary-seq-len-interpolation-factor": True,
}
CHOICES = {"--fp8-format": ["e4m3", "hybrid"], "--fp8-recipe": ["tensorwise", "delayed", "mxfp8", "blockwise"],
           "--fp8-amax-compute-algo": ["most_recent", "max"],
           "--moe-token-dispatcher-type": ["allgather", "alltoall", "flex", "alltoall_seq"],
           "--moe-flex-dispatcher-backend": ["deepep", "hybridep"],
           "--moe-router-load-balancing-type": ["aux_loss", "seq_aux_loss", "sinkhorn", "none"],
           "--moe-router-score-function": ["softmax", "sigmoid"]}
TRANSFORMER_CONFIG_FIELDS = {
    "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_layer_freq",
    "moe_shared_expert_intermediate_size", "moe_grouped_gemm", "moe_token_dispatcher_type",
    "moe_router_load_balancing_type", "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
    "moe_flex_dispatcher_backend",
    "multi_latent_attention", "fp8", "fp8_recipe", "fp8_amax_history_len", "fp8_amax_compute_algo",
}
MODEL_PARALLEL_CONFIG_FIELDS = {"context_parallel_size", "cp_comm_type", "expert_model_parallel_size",
                                "expert_tensor_parallel_size", "bf16"}
TORCHTITAN = {"parallelism": {"context_parallel_degree", "expert_parallel_degree"}, "model": {"converters"},
              "quantize.linear.float8": {"recipe_name", "enable_fsdp_float8_all_gather"}}


def _setup(model: str, gpus: int, cand: Candidate, **training) -> RunSetup:
    m = get_preset(model)
    t = TrainingSpec(**{**dict(global_batch=512, seq_len=8192, framework="megatron-lm"), **training})
    return RunSetup(model=m, cluster=make_cluster(gpu="H100", gpus=gpus), training=t, candidate=cand)


CASES = {
    "mixtral-ep-fp8": _setup("mixtral-8x22b", 128, Candidate(tp=4, pp=4, dp=8, ep=8, etp=1, sp=True, mbs=1, gas=64,
                                                             zero=1), precision="fp8", moe_capacity_factor=1.25),
    "llama31-cp16": _setup("llama3.1-405b", 1152, Candidate(tp=8, pp=9, dp=1, cp=16, sp=True, mbs=1, gas=128, zero=1,
                                                            recompute="full"), global_batch=128, seq_len=131072),
    "qwen3-moe": _setup("qwen3-30b-a3b", 16, Candidate(tp=1, pp=2, dp=8, ep=8, mbs=1, gas=64, zero=1),
                        seq_len=4096),
    "deepseek-mla": _setup("deepseek-v3", 256, Candidate(tp=1, pp=1, dp=256, ep=64, mbs=1, gas=2, zero=1),
                           seq_len=4096),
    # NVIDIA's DGX-H100 run (Megatron-Bridge deepseek_workload_base_configs.py DEEPSEEK_V3_PRETRAIN_CONFIG_H100_V1:
    # 1,024 GPUs, TP2 PP8 VP4 EP64, GBS 8192, pp_layout "Et|(tt|)*30mL")
    "deepseek-layout": _setup("deepseek-v3", 1024, Candidate(tp=2, pp=8, dp=64, ep=64, sp=True, mbs=1, gas=128,
                                                             zero=1, vpp=4,
                                                             recompute="modules:mla_up_proj+mlp"),
                              seq_len=4096, global_batch=8192),
    # the same with its published dispatcher (DEEPSEEK_V3_H100_BASE_CONFIG at v0.2.1: moe_flex_dispatcher_backend
    # "deepep", i.e. --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep)
    "deepseek-deepep": _setup("deepseek-v3", 1024, Candidate(tp=2, pp=8, dp=64, ep=64, sp=True, mbs=1, gas=128,
                                                             zero=1, vpp=4, recompute="modules:mla_up_proj+mlp"),
                              seq_len=4096, global_batch=8192, moe_dispatcher="deepep"),
    # the same without recompute, the experts' inputs offloaded to the host (--activation-offload)
    "deepseek-act-offload": _setup("deepseek-v3", 1024, Candidate(tp=2, pp=8, dp=64, ep=64, sp=True, mbs=1, gas=128,
                                                                  zero=1, vpp=4), seq_len=4096, global_batch=8192,
                                   activation_offload=("expert_fc1", "moe_act")),
    # the same with half the optimizer on the host, FP8 current scaling (Megatron refuses --fp8-param-gather there)
    "deepseek-offload": _setup("deepseek-v3", 1024, Candidate(tp=2, pp=8, dp=64, ep=64, sp=True, mbs=1, gas=128,
                                                              zero=1, vpp=4, recompute="modules:mla_up_proj+mlp"),
                               seq_len=4096, global_batch=8192, optimizer_offload=0.5, precision="fp8",
                               fp8_recipe="tensorwise"),
    # a layout plan finds only with its own CPU optimizer offload (Candidate.opt_offload, bf16: --fp8-param-gather
    # does not arise); RunSetup folds it into the training's --optimizer-offload-fraction
    "deepseek-opt-offload-searched": _setup("deepseek-v3", 1024, Candidate(tp=2, pp=8, dp=64, ep=8, sp=True, mbs=1,
                                                                           gas=128, zero=1, vpp=2, recompute="full",
                                                                           opt_offload=0.75),
                                            seq_len=4096, global_batch=8192),
    # a layout plan finds only with both offloads (bf16, no recompute: ranked 63rd; Megatron-LM rules out neither with
    # the other); RunSetup folds both into the training's --offload-modules and --optimizer-offload-fraction
    "deepseek-both-offloads-searched": _setup(
        "deepseek-v3", 1024, Candidate(tp=2, pp=32, dp=16, ep=4, sp=True, mbs=1, gas=512, zero=1,
                                       offload="attn_norm+qkv_linear+core_attn+attn_proj+mlp_norm+expert_fc1+moe_act",
                                       opt_offload=0.5),
        seq_len=4096, global_batch=8192),
    # AdamW's moments in BF16 as DeepSeek-V3 trained (report Sec. 3.3.3): --use-precision-aware-optimizer
    # --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16, FP8 blockwise with --fp8-param-gather
    "deepseek-bf16-moments": _setup("deepseek-v3", 1024, Candidate(tp=2, pp=8, dp=64, ep=64, sp=True, mbs=1, gas=128,
                                                                   zero=1, vpp=4, recompute="modules:mla_up_proj+mlp"),
                                    seq_len=4096, global_batch=8192, precision="fp8", fp8_recipe="blockwise",
                                    optimizer_state_dtype="bf16"),
    # CUDA graphs as Megatron-Bridge 25.11 (v0.2.0) runs Qwen3-30B-A3B on DGX-B200: TE graphs of the router and the
    # dispatcher's preprocess (QWEN3_30B_A3B_B200_FP8_CS_BASE_CONFIG: cuda_graph_scope ["moe_router", "moe_preprocess"])
    "qwen3-cuda-graphs": _setup("qwen3-30b-a3b", 8, Candidate(tp=1, pp=1, dp=8, ep=8, mbs=1, gas=64, zero=1),
                                seq_len=4096, cuda_graphs=("moe_router", "moe_preprocess")),
    # a whole-iteration graph (--cuda-graph-impl local): drop-and-pad MoE, no host sync to break the capture
    "mixtral-full-iteration": _setup("mixtral-8x22b", 128, Candidate(tp=4, pp=4, dp=8, ep=8, etp=1, sp=True, mbs=1,
                                                                     gas=64, zero=1), moe_capacity_factor=1.25,
                                     cuda_graphs=("full_iteration",)),
    # a dense FP8 model's whole layers graphed (transformer_engine, no --cuda-graph-scope)
    "llama-layer-graphs": _setup("llama3-70b", 64, Candidate(tp=4, pp=2, dp=8, sp=True, mbs=1, gas=64, zero=1),
                                 precision="fp8", cuda_graphs=("layer",)),
    # EP all-to-all overlap (--overlap ep-a2a): interleaved PP, as transformer_config.py asks of it
    "mixtral-ep-a2a-overlap": _setup("mixtral-8x22b", 64, Candidate(tp=1, pp=2, dp=32, ep=8, mbs=1, gas=16, zero=1,
                                                                    vpp=2), seq_len=4096,
                                     overlap=("grad-reduce", "param-gather", "p2p", "ep-a2a")),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    for flag, takes_value in MEGATRON_FLAGS.items():
        if takes_value:
            p.add_argument(flag, choices=CHOICES.get(flag), nargs="+" if flag == "--cp-comm-type" else None)
        else:
            p.add_argument(flag, action="store_true")
    return p


@pytest.mark.parametrize("name", CASES)
def test_megatron_flags_are_megatron_lm_s_and_parse(name):
    flags = megatron_lm_flags(CASES[name])
    assert flags
    assert {f[0] for f in flags} <= set(MEGATRON_FLAGS)
    for f in flags:
        assert len(f) == (2 if MEGATRON_FLAGS[f[0]] else 1), f
    _parser().parse_args([token for f in flags for token in f])


def _args(setup: RunSetup) -> dict[str, list[str]]:
    """args.txt (one flag and its values a line) as {flag: values}."""
    lines = render(setup, "megatron-lm")["args.txt"].splitlines()
    return {line.split()[0]: line.split()[1:] for line in lines}


@pytest.mark.parametrize("name", CASES)
def test_megatron_lm_args_carry_cp_ep_moe_fp8(name):
    setup = CASES[name]
    args, c = _args(setup), setup.candidate
    for flag in megatron_lm_flags(setup):   # every extra flag reaches args.txt with its value
        assert args[flag[0]] == flag[1:], flag
    assert args.get("--context-parallel-size", ["1"]) == [str(c.cp)]
    if setup.model.num_experts:
        assert args["--num-experts"] == [str(setup.model.num_experts)]
        assert (args["--expert-model-parallel-size"], args["--expert-tensor-parallel-size"]) == ([str(c.ep)], [str(c.etp)])
    if setup.training.precision == "fp8":
        assert args["--fp8-format"] == ["hybrid"] and "--bf16" in args and "--fp16" not in args


def test_deepseek_layer_freq_pattern_and_mla():
    args = _args(CASES["deepseek-mla"])
    freq = [int(x) for x in args["--moe-layer-freq"][0].strip("[]").split(",")]
    assert freq[:3] == [0, 0, 0] and sum(freq) == 58 and len(freq) == 61
    assert args["--moe-shared-expert-intermediate-size"] == ["2048"]
    assert (args["--q-lora-rank"], args["--kv-lora-rank"], args["--qk-pos-emb-head-dim"]) == (["1536"], ["512"], ["64"])


def test_deepseek_runs_nvidia_s_pipeline_layout_and_its_mtp_layer():
    """The layout sets VPP in Megatron-LM (arguments.py: --num-virtual-stages-per-pipeline-rank, --num-layers-per-
    virtual-pipeline-stage and --pipeline-model-parallel-layout exclude each other), and names the MTP layer
    (pipeline_parallel_layer_layout.py: the count of m must equal --mtp-num-layers)."""
    args = _args(CASES["deepseek-layout"])
    assert args["--pipeline-model-parallel-layout"] == ["Et|(tt|)*30mL"] and args["--mtp-num-layers"] == ["1"]
    assert args["--recompute-granularity"] == ["selective"] and args["--recompute-modules"] == ["mla_up_proj", "mlp"]
    for flag in ("--num-virtual-stages-per-pipeline-rank", "--decoder-first-pipeline-num-layers",
                 "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"):
        assert flag not in args


@pytest.mark.parametrize("name", ["mixtral-ep-fp8", "llama31-cp16", "qwen3-moe", "deepseek-mla"])
def test_plan_yaml_round_trips_cp_ep_fp8(name, tmp_path):
    setup = CASES[name]
    from planner.emit import emit

    emit(setup, "megatron-lm", tmp_path)
    assert load_plan_yaml(tmp_path / "plan.yaml") == setup


def test_torchtitan_keys_for_fsdp():
    import tomllib

    m = get_preset("llama3-8b").with_overrides(seq_len=32768)
    setup = RunSetup(model=m, cluster=make_cluster(gpu="H100", gpus=64),
                     training=TrainingSpec(global_batch=512, seq_len=32768, framework="fsdp", precision="fp8"),
                     candidate=Candidate(tp=1, pp=1, dp=32, cp=2, mbs=1, gas=16, zero=3))
    d = tomllib.loads(render(setup, "fsdp", torchtitan_version="0.2.2")["torchtitan.toml"])
    assert {"context_parallel_degree", "expert_parallel_degree"} <= set(TORCHTITAN["parallelism"])
    assert (d["parallelism"]["context_parallel_degree"], d["parallelism"]["expert_parallel_degree"]) == (2, 1)
    assert d["parallelism"]["data_parallel_shard_degree"] == 32
    assert d["model"]["converters"] == ["quantize.linear.float8"]
    assert set(d["quantize"]["linear"]["float8"]) == TORCHTITAN["quantize.linear.float8"]
    assert d["training"]["mixed_precision_param"] == "bfloat16"


@pytest.mark.parametrize("kind,setup,needle", [
    ("megatron-deepspeed", replace(CASES["llama31-cp16"], training=replace(
        CASES["llama31-cp16"].training, flash_attention=True)), "has no context parallelism"),
    ("megatron-deepspeed", CASES["qwen3-moe"], "cannot express mixture-of-experts layers"),
    ("megatron-deepspeed", CASES["mixtral-ep-fp8"], "has no FP8 training"),
    ("megatron-lm", replace(CASES["mixtral-ep-fp8"], cluster=make_cluster(gpu="A100-80GB", gpus=128)),
     "has no FP8 tensor cores"),
    ("megatron-lm", replace(CASES["qwen3-moe"], candidate=replace(CASES["qwen3-moe"].candidate, ep=3)),
     "experts % EP 3"),
    ("fsdp", replace(CASES["mixtral-ep-fp8"], candidate=Candidate(tp=1, pp=1, dp=128, ep=8, etp=2, mbs=1, gas=4,
                                                                  zero=3)), "no expert tensor parallelism"),
    ("fsdp", replace(CASES["qwen3-moe"], candidate=Candidate(tp=1, pp=1, dp=16, ep=8, mbs=1, gas=32, zero=3)),
     "torchtitan (--emit fsdp) cannot express mixture-of-experts"),
])
def test_targets_refuse_what_they_cannot_run(kind, setup, needle):
    with pytest.raises(InputError) as err:
        render(setup, kind)
    assert needle in str(err.value)
