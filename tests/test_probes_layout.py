"""Probe configuration checks, the torchrun command and outcome classification (no processes).

    python -m pytest tests/test_probes_layout.py -q
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest_probes import tiny_model, tiny_spec
from probes.launch import torchrun_argv
from probes.layout import LayoutError, resolve_layout
from probes.outcome import RankFailure, classify, parse_torchrun_failures, root_cause
from conftest import HANG_GUARD_S


@pytest.mark.parametrize("candidate, world, needle", [
    (dict(tp=3), 3, "attention heads 4 are not divisible by TP 3"),
    (dict(pp=3, gas=3), 3, "layers 4 are not divisible by pp 3"),
    (dict(dp=2), 3, "world size 3 != tp(1) * pp(1) * dp(2) = 2"),
    (dict(pp=2, gas=1), 2, "1F1B needs micro-batches (gas) 1 >= pipeline stages (pp) 2"),
    (dict(sp=True), 1, "sequence parallelism needs TP > 1"),
    (dict(recompute="some"), 1, "recompute 'some' is not one of none, selective, full, block-N or selective-op"),
    (dict(recompute="uniform-2"), 1, "recompute 'uniform-2' is not one of none, selective, full, block-N or "
                                     "selective-op"),
    (dict(vpp=2), 1, "vpp 2 > 1 needs pp > 1"),
])
def test_invalid_layouts_say_why(candidate, world, needle):
    with pytest.raises(LayoutError, match=re.escape(needle)):
        resolve_layout(tiny_spec(**candidate), world=world)


def test_op_level_sac_is_a_probe_layout():
    assert resolve_layout(tiny_spec(recompute="selective-op"), world=1).recompute == "selective-op"


def test_gqa_kv_heads_must_divide_tp():
    with pytest.raises(LayoutError, match="key/value heads 1 are not divisible by TP 2"):
        resolve_layout(tiny_spec(model=tiny_model(kv_heads=1), tp=2), world=2)


def test_single_replica_and_fewer_layers_are_reduced():
    full = resolve_layout(tiny_spec(dp=4, tp=2), world=8)
    assert not full.reduced and full.dp_run == 4
    one = resolve_layout(tiny_spec(dp=4, tp=2), world=2)
    assert one.reduced and one.dp_run == 1 and one.dp_full == 4 and one.global_batch_run == 2 * 2
    short = resolve_layout(tiny_spec(pp=2, gas=2, layers_run=2), world=2)
    assert short.reduced and short.layers_run == 2 and short.layers_full == 4


@pytest.mark.parametrize("candidate, world, impl, replicate, shard, reshard", [
    (dict(dp=2, zero=0), 2, "ddp", 1, 2, False),
    (dict(dp=2, zero=1), 2, "fsdp", 1, 2, False),
    (dict(dp=2, zero=2), 2, "fsdp", 1, 2, False),
    (dict(dp=2, zero=3), 2, "fsdp", 1, 2, True),
    (dict(dp=2, pp=2, zero=0), 4, "fsdp", 2, 1, False),     # DDP under PP asserts: replicate with FSDP2
    (dict(dp=2, tp=2, zero=0), 4, "fsdp", 2, 1, False),
    (dict(dp=1, tp=2), 2, "none", 1, 1, False),
])
def test_data_parallel_implementation(candidate, world, impl, replicate, shard, reshard):
    lay = resolve_layout(tiny_spec(**candidate), world=world)
    assert (lay.dp_impl, lay.dp_replicate, lay.dp_shard, lay.reshard_after_forward) == (impl, replicate, shard, reshard)


def test_hybrid_shards_inside_a_node_and_replicates_across():
    lay = resolve_layout(tiny_spec(dp=8, zero=3, hybrid=True), world=8, local_world=4)
    assert (lay.dp_replicate, lay.dp_shard, lay.dp_impl) == (2, 4, "fsdp")


def test_vpp_selects_interleaved_schedule():
    lay = resolve_layout(tiny_spec(pp=2, vpp=2, gas=2), world=2)
    assert lay.schedule == "Interleaved1F1B" and lay.stages == 4


def test_torchrun_argv_is_an_argument_list():
    argv = torchrun_argv(spec_path=Path("s.json"), out_dir=Path("d"), nproc=2, log_dir=Path("d/logs"))
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    assert "--standalone" in argv and argv[argv.index("--nproc-per-node") + 1] == "2"
    assert argv[-6:] == ["-m", "probes.train", "--spec", "s.json", "--out", "d"]
    multi = torchrun_argv(spec_path=Path("s"), out_dir=Path("d"), nproc=8, nnodes=2, rdzv_endpoint="n1:29500")
    assert "--standalone" not in multi and multi[multi.index("--rdzv-endpoint") + 1] == "n1:29500"
    with pytest.raises(ValueError):
        torchrun_argv(spec_path=Path("s"), out_dir=Path("d"), nproc=8, nnodes=2)


TORCHRUN_SUMMARY = """
Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 11638)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : -6 (pid: 11639)  (SIGABRT)
"""


def test_parse_torchrun_failures():
    assert parse_torchrun_failures(TORCHRUN_SUMMARY) == {1: -15, 0: -6}


def test_root_cause_skips_peer_failures_and_agent_kills():
    peer = RankFailure(rank=0, status="crash", message="RuntimeError: Connection reset by peer", time_s=1.0,
                       has_record=True)
    abrupt = RankFailure(rank=1, status="crash", message="exited with code 3", exitcode=3)
    killed = RankFailure(rank=2, status="crash", message="killed by SIGTERM", exitcode=-15)
    assert root_cause([peer, killed, abrupt]).rank == 1
    own = RankFailure(rank=3, status="oom", message="OutOfMemoryError", time_s=2.0, has_record=True)
    assert root_cause([peer, abrupt, own]).rank == 3


def test_classify_uses_error_records(tmp_path):
    (tmp_path / "error-rank0.json").write_text(json.dumps(
        {"rank": 0, "status": "crash", "message": "RuntimeError: Connection closed by peer", "time": 2.0}))
    (tmp_path / "error-rank1.json").write_text(json.dumps(
        {"rank": 1, "status": "oom", "message": "DefaultCPUAllocator: can't allocate memory", "time": 1.0}))
    r = classify(tmp_path, returncode=1, timed_out=False, timeout_s=10)
    assert (r.status, r.root_cause_rank) == ("oom", 1)
    assert classify(tmp_path, returncode=None, timed_out=True, timeout_s=10).status == "oom"


def test_classify_timeout_and_log_oom(tmp_path):
    assert classify(tmp_path, returncode=None, timed_out=True, timeout_s=10).status == "timeout"
    r = classify(tmp_path, returncode=1, timed_out=False, timeout_s=10,
                 rank_logs={0: "fine\n", 1: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"})
    assert (r.status, r.root_cause_rank) == ("oom", 1)


def test_torch_free_modules_do_not_import_torch():
    code = ("import sys, probes.backend, probes.launch, probes.layout, probes.outcome, probes.result; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                          timeout=HANG_GUARD_S).returncode == 0
