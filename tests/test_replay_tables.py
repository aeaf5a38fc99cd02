"""The replay backend matches every dimension, refuses what it does not understand, and says why a row
was never probed; the published tables (tr11, Hagemann) replay as measurement tables.

    python -m pytest tests/test_replay_tables.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest
from published import tables_of

from planner import Candidate, TrainingSpec, make_cluster, plan
from planner.model import ModelSpec
from probes.result import ProbeSpec
from search._base import TuneError
from search.cli import main
from search.published_tables import read_table, write_csv
from search.replay import ReplayBackend, ReplayTable

DATA = Path(__file__).resolve().parent / "data"
HAGEMANN = DATA / "hagemann_13b_dev.yaml"
TR11 = DATA / "published_dev.yaml"

# a small Megatron-LM setup: 8 GPUs in one node, SP enumerated for TP > 1
MODEL = ModelSpec(name="tiny", layers=8, hidden=1024, heads=16, kv_heads=16, ffn_hidden=4096, vocab=32000,
                  seq_len=1024)
CLUSTER = make_cluster(gpu="A100-80GB", gpus=8, gpus_per_node=8)
TRAINING = TrainingSpec(global_batch=64, seq_len=1024, framework="megatron-lm", recompute_options=("none",),
                        zero_options=(1,))
HEADER = "tp,pp,dp,micro_batch,global_batch,seq_len,activation_recompute,zero_stage,{extra}seconds_per_iteration,status"


def write(tmp_path: Path, rows: list[str], extra: str = "") -> str:
    path = tmp_path / "t.csv"
    path.write_text("\n".join([HEADER.format(extra=extra), *rows]) + "\n")
    return str(path)


def answer(table: ReplayTable, cand: Candidate):
    spec = ProbeSpec(model=MODEL.to_dict(), candidate=cand.to_dict(), precision="bf16", warmup_steps=1, steps=1)
    return ReplayBackend(table).run(spec, workdir=Path("."), timeout_s=10)


def cand(**kw) -> Candidate:
    base = dict(tp=2, pp=1, dp=4, mbs=2, gas=8, recompute="none", zero=1)
    return Candidate(**{**base, **kw})


def test_an_sp_trial_gets_the_sp_row_never_the_sp0_row(tmp_path):
    table = ReplayTable.read(write(tmp_path, ["2,1,4,2,64,1024,none,1,0,10.0,ok", "2,1,4,2,64,1024,none,1,1,12.0,ok"],
                                   extra="sequence_parallel,"))
    assert answer(table, cand(sp=False)).step_time_median_s == 10.0
    assert answer(table, cand(sp=True)).step_time_median_s == 12.0
    keep, _ = table.restrict(plan(MODEL, CLUSTER, TRAINING))
    assert cand(sp=False).label() in keep and cand(sp=True).label() in keep


def test_a_table_without_the_sp_column_measured_sp_off(tmp_path):
    table = ReplayTable.read(write(tmp_path, ["2,1,4,2,64,1024,none,1,10.0,ok"]))
    assert answer(table, cand(sp=False)).step_time_median_s == 10.0
    sp = answer(table, cand(sp=True))
    assert sp.status == "invalid" and "not measured" in sp.reason
    assert answer(table, cand(zero=0)).status == "invalid"           # the ZeRO column is matched too
    assert answer(table, cand(vpp=2, pp=4, dp=1)).status == "invalid"


def test_unknown_columns_are_refused_with_one_line(tmp_path, capsys):
    path = write(tmp_path, ["2,1,4,2,64,1024,none,1,1,10.0,ok"], extra="zero_bucket,")
    with pytest.raises(TuneError, match="column 'zero_bucket' is not understood"):
        ReplayTable.read(path)
    argv = ["--model", "1B3", "--gpus", "8", "--global-batch", "64", "--seq-len", "1024", "--backend", "replay",
            "--results", path, "--storage", f"sqlite:///{tmp_path}/t.db", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "zero_bucket" in err[0]


def test_the_candidates_own_names_are_columns_too(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("tp,pp,dp,mbs,recompute,zero,sp,seconds_per_iteration,status\n2,1,4,2,none,1,1,12.0,ok\n")
    table = ReplayTable.read(str(path))
    assert answer(table, cand(sp=True)).step_time_median_s == 12.0
    assert answer(table, cand(sp=False)).status == "invalid"
    path.write_text("tp,pp,dp,mbs,micro_batch,seconds_per_iteration,status\n2,1,4,2,2,12.0,ok\n")
    with pytest.raises(TuneError, match="'micro_batch' is given twice"):
        ReplayTable.read(str(path))


@pytest.mark.parametrize("cell", ["nan", "inf", "-3", "", "fast"])
def test_an_ok_row_needs_a_step_time(cell, tmp_path):
    with pytest.raises(TuneError, match="seconds_per_iteration"):
        ReplayTable.read(write(tmp_path, [f"2,1,4,2,64,1024,none,1,{cell},ok"]))


def test_a_row_matching_several_configurations_is_refused(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("tp,pp,dp,micro_batch,seconds_per_iteration,status\n2,1,4,2,10.0,ok\n")
    training = TrainingSpec(global_batch=64, seq_len=1024, framework="megatron-lm", recompute_options=("none", "full"),
                            zero_options=(1,))
    with pytest.raises(TuneError, match="matches 2 configurations .* differ in recompute"):
        ReplayTable.read(str(path)).restrict(plan(MODEL, CLUSTER, training))


def test_not_probed_says_why_once_per_configuration(tmp_path):
    rows = ["2,1,4,2,64,1024,none,1,10.0,ok",
            "2,1,4,3,64,1024,none,1,9.0,ok",       # MBS 3: not a power of two, never enumerated
            "2,1,4,3,64,1024,none,1,9.5,ok",       # its duplicate: listed once
            "1,1,8,2,64,1024,full,1,11.0,ok",      # recompute=full: not among --recompute none
            "2,2,4,2,64,1024,none,1,11.0,ok"]      # 16 GPUs on an 8-GPU plan
    table = ReplayTable.read(write(tmp_path, rows))
    keep, orphans = table.restrict(plan(MODEL, CLUSTER, TRAINING))
    assert keep == {cand().label()}
    why = dict(orphans)
    assert len(orphans) == 3
    assert "MBS 3 is not enumerated" in why["tp=2,pp=1,dp=4,mbs=3,recompute=none,zero=1"]
    assert "the table's best measured row" in why["tp=2,pp=1,dp=4,mbs=3,recompute=none,zero=1"]
    assert "recompute=full is not enumerated" in why["tp=1,pp=1,dp=8,mbs=2,recompute=full,zero=1"]
    assert "is not the plan's 8 GPUs" in why["tp=2,pp=2,dp=4,mbs=2,recompute=none,zero=1"]


def test_tune_lists_each_row_it_never_probed_with_the_reason(tmp_path, capsys):
    path = tmp_path / "t.csv"
    path.write_text("tp,pp,dp,micro_batch,global_batch,seq_len,activation_recompute,seconds_per_iteration,status\n"
                    "1,1,8,1,512,2048,full,30,ok\n1,2,4,1,512,2048,full,31,ok\n1,1,8,3,512,2048,full,25,ok\n"
                    "1,1,8,3,512,2048,full,26,ok\n")
    argv = ["--model", "1B3", "--gpu", "V100-32GB", "--gpus", "8", "--gpus-per-node", "4", "--global-batch", "512",
            "--seq-len", "2048", "--precision", "fp16", "--recompute", "full", "--zero", "1", "--no-rampup",
            "--backend", "replay", "--results", str(path), "--storage", f"sqlite:///{tmp_path}/t.db",
            "--no-progress", "--confirm-top", "0"]
    assert main(argv) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if "not probed" in x]
    assert len(lines) == 1
    assert "mbs=3" in lines[0] and "MBS 3 is not enumerated" in lines[0] and "the table's best" in lines[0]


def test_the_headline_best_is_probed_and_only_ooms_are_ruled_out_on_memory():
    """Hagemann's headline (TP1 PP1 on 64 A100s) was once pruned by the 75% rule; the rule is advisory now."""
    t = read_table(str(HAGEMANN), "hagemann-bfloat16-64-gpus-flash-attention2-rms-kernel")
    _, orphans = t.table.restrict(plan(t.model, t.cluster, t.training))
    assert not [why for _, why in orphans if "the table's best" in why]
    assert orphans and all("(oom)" in why and "memory_total" in why for _, why in orphans)
    assert len(orphans) == len(set(row for row, _ in orphans))


def test_hagemann_sheets_replay_with_ooms_as_oom_outcomes():
    tables = {t.name: t for t in tables_of(HAGEMANN.name)}
    assert len(tables) == 11 and sum(len(t.table.rows) for t in tables.values()) == 422
    t = tables["hagemann-bfloat16-32-gpus-sequence-parallelism-flash-attention2-rms-kernel"]
    p = plan(t.model, t.cluster, t.training)
    keep, _ = t.table.restrict(p)
    sp = [e.candidate for e in p.candidates if e.candidate.label() in keep and e.candidate.sp]
    assert sp, "the sheet's sequence-parallel rows replay as SP candidates"
    results = [answer(t.table, c) for c in sp]
    assert {r.status for r in results} == {"ok", "oom"}
    for c, r in zip(sp, results):
        row = next(x for x in t.table.rows if x.matches(c))
        assert row.sp is True and (r.status == "oom") == (row.status == "oom")


def test_tr11_tables_replay_and_flagged_rows_are_skipped(tmp_path):
    tables = {t.name: t for t in tables_of(TR11.name)}
    t = tables["tr11-48-node-contenders-h14336-l72-a64-n48"]
    assert len(t.table.rows) == 7 and t.cluster.world_size == 384
    keep, orphans = t.table.restrict(plan(t.model, t.cluster, t.training))
    assert len(keep) == 7 and not orphans
    skipped = dict(t.skipped)
    assert "different code branches" in skipped["bloom_prequel_L670_n48_tp8_pp12_dp4_mbs2_h64_gbs2048"]
    assert "inconsistent" in skipped["bloom_prequel_L648_n40_tp8_pp10_dp8_mbs4_h64_gbs2048"]
    # the CSV the converter writes reads back as the same table
    write_csv(t, tmp_path / "t.csv")
    again = ReplayTable.read(str(tmp_path / "t.csv"))
    assert [(r.key, r.step_time_s) for r in again.rows] == [(r.key, r.step_time_s) for r in t.table.rows]
