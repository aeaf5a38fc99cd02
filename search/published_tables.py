"""The published measurement files of ../shared/data as replay tables, each with the setup to plan it.

    python -m search.published_tables ../shared/data/hagemann_13b_dev.yaml              # list the tables
    python -m search.published_tables ../shared/data/published_dev.yaml --out tables/    # CSV + model YAML + command
    >>> from search.published_tables import read_tables
    >>> for t in read_tables("../shared/data/hagemann_13b_dev.yaml"): t.name, t.model, t.cluster, t.training, t.table

Two sources (README_published.md in that folder describes the fields):

- ``published_dev.yaml``, group ``bloom176b_tr11_prequel_topology_search`` (BigScience tr11 prequel,
  48x8 A100-80GB, Megatron-DeepSpeed, fp16, full recompute). One table per section of the chronicle
  and model shape (hidden, layers, heads) and node count: the rows a person compared on one machine.
  Rows whose model shape is not given (NLAYERS "tweaked to fit PP") and rows the source flags
  (internally inconsistent, or "ran on different branches") are skipped, each with its reason. The
  other groups of that file are single runs of other frameworks, not tables.
- ``hagemann_13b_dev.yaml`` (Hagemann et al. 2023, Llama 13B on A100-80GB): one table per sheet and
  attention kernel; OOM rows are OOM outcomes.

Assumptions (the sources do not say; each also in `PublishedTable.assumptions`): Hagemann's global batch
2048 sequences at seq 2048 and 512 at 8192 (MFU x step time implies them, file header), bf16,
Megatron-LM-like (SP, distributed optimizer = ZeRO-1), FlashAttention for every kernel but ``torch``
and ``fused``; tr11: inter-node 4x100 Gb/s Omni-Path per node (``hardware.interconnect``), FFN 4h.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from planner import ClusterSpec, ModelSpec, TrainingSpec, get_preset, make_cluster
from planner.model import model_to_yaml_dict

from search._base import TuneError
from search.replay import ReplayRow, ReplayTable

TR11_GROUP = "bloom176b_tr11_prequel_topology_search"
TR11_INTER_NODE_GBPS = 400.0
"""Jean Zay gpu_p5: 4x Omni-Path 100 Gb/s per node (published_dev.yaml hardware.interconnect)"""
TR11_SKIP = (("different branches", "the source warns these rows ran on different code branches"),
             ("INCONSISTEN", "the source row is internally inconsistent (see its notes)"))
HAGEMANN_GBS = {2048: 2048, 8192: 512}
"""seq_len -> global batch (sequences): not in the sheets; MFU x step time implies them (file header)"""
HAGEMANN_NO_FLASH = ("torch", "fused")
HAGEMANN_RECOMPUTE = {"disabled": "none", "every_layer": "full"}


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedTable:
    name: str
    source: str
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    table: ReplayTable
    assumptions: str
    skipped: tuple[tuple[str, str], ...] = ()
    """(row id, why) for rows of this source not made into any table"""

    def tune_flags(self, model_arg: str) -> list[str]:
        """The setup flags of `tune` (and `plan`) that plan what this table measured."""
        c, t = self.cluster, self.training
        flags = ["--model", model_arg, "--gpu", c.gpu.id, "--gpus", str(c.world_size),
                 "--gpus-per-node", str(c.gpus_per_node),
                 "--inter-node-gbps", f"{c.inter_node_bw_bytes_per_s * 8 / 1e9:g}",
                 "--framework", t.framework, "--global-batch", str(t.global_batch), "--seq-len", str(t.seq_len),
                 "--precision", t.precision, "--recompute", ",".join(t.recompute_options),
                 "--zero", ",".join(map(str, t.zero_options)), "--no-rampup",
                 "--flash-attention" if t.flash_attention else "--no-flash-attention"]
        return flags


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _zero(text: object) -> int:
    m = re.match(r"\s*(\d)", str(text))
    if not m:
        raise TuneError(f"zero_stage {text!r} does not start with a stage number")
    return int(m.group(1))


def _tr11_tables(path: str, runs: list[dict]) -> list[PublishedTable]:
    groups: dict[str, list[dict]] = {}
    skipped: list[tuple[str, str]] = []
    for run in runs:
        if run.get("group") != TR11_GROUP:
            continue
        notes, verification = str(run.get("notes", "")), str(run.get("verification", ""))
        flag = next((why for text, why in TR11_SKIP if text in notes or text in verification), None)
        m = run["model"]
        if flag is None and (m.get("layers") is None or m.get("heads") is None):
            flag = "the model's layers/heads are not given (NLAYERS tweaked to fit PP)"
        if flag is not None:
            skipped.append((run["id"], flag))
            continue
        section = notes.split("|")[0].replace("section:", "").strip()
        section = re.sub(r"\s*\(PP=\d+/DP=\d+\)", "", section)     # one contest, split by PP in the chronicle
        name = f"tr11-{_slug(section)}-h{m['hidden']}-l{m['layers']}-a{m['heads']}-n{run['hardware']['nodes']}"
        groups.setdefault(name, []).append(run)
    out = []
    base = get_preset("bloom-176b")
    for name, rows in groups.items():
        first = rows[0]
        m, h, p = first["model"], first["hardware"], first["parallel"]
        model = base.with_overrides(name=name, layers=m["layers"], hidden=m["hidden"], heads=m["heads"],
                                    kv_heads=m["heads"], ffn_hidden=4 * m["hidden"], vocab=m["vocab"],
                                    seq_len=m["seq_len"], rampup=None)
        cluster = make_cluster(gpu="A100-80GB", nodes=h["nodes"], gpus_per_node=h["gpus_per_node"],
                               inter_node_gbps=TR11_INTER_NODE_GBPS)
        zeros = tuple(sorted({_zero(r["parallel"]["zero_stage"]) for r in rows}))
        training = TrainingSpec(global_batch=p["global_batch"], seq_len=m["seq_len"], precision="fp16",
                                framework="megatron-deepspeed", flash_attention=False,
                                recompute_options=("full",), zero_options=zeros)
        replay_rows = []
        for i, r in enumerate(rows):
            q, me = r["parallel"], r["measured"]
            replay_rows.append(ReplayRow(
                tp=q["tp"], pp=q["pp"], dp=q["dp"], mbs=q["micro_batch"], recompute="full",
                zero=_zero(q["zero_stage"]) if q["dp"] > 1 else 0, status="ok",
                step_time_s=float(me["seconds_per_iteration"]), memory_gb=me.get("memory_gb_per_gpu"),
                global_batch=q["global_batch"], seq_len=r["model"]["seq_len"],
                world=r["hardware"]["nodes"] * r["hardware"]["gpus_per_node"], line=i + 1))
        out.append(PublishedTable(
            name=name, source=f"{path} group {TR11_GROUP}: {', '.join(r['id'] for r in rows)}", model=model,
            cluster=cluster, training=training, table=ReplayTable(path=path, table=name, rows=tuple(replay_rows)),
            assumptions="recompute full (assumed by the source file), fp16, FFN 4h, inter-node 400 Gb/s",
            skipped=tuple(skipped)))
    return out


def _hagemann_tables(path: str, rows: list[dict]) -> list[PublishedTable]:
    groups: dict[str, list[dict]] = {}
    for r in rows:
        sheet = Path(str(r["file"])).stem.replace("llama_13B_", "").replace("_all_runs", "")
        groups.setdefault(f"hagemann-{_slug(sheet)}-{_slug(str(r['kernel']))}", []).append(r)
    out = []
    base = get_preset("llama2-13b")
    for name, group in groups.items():
        first = group[0]
        seq, world = int(first["seq_len"]), int(first["world_size"])
        if seq not in HAGEMANN_GBS:
            raise TuneError(f"{path}: sequence length {seq} has no known global batch")
        model = base.with_overrides(name=name, seq_len=seq, rampup=None)
        cluster = make_cluster(gpu="A100-80GB", gpus=world, gpus_per_node=8)
        # their framework keeps 16-bit gradients and shards the optimizer over DP: DeepSpeed-style ZeRO-1
        training = TrainingSpec(global_batch=HAGEMANN_GBS[seq], seq_len=seq, precision="bf16",
                                framework="megatron-deepspeed", flavor="microsoft", flash_attention=first["kernel"] not in HAGEMANN_NO_FLASH,
                                recompute_options=("none", "full"), zero_options=(1,))
        replay_rows = []
        for i, r in enumerate(group):
            recompute = HAGEMANN_RECOMPUTE.get(str(r["activation_checkpointing"]))
            if recompute is None:
                raise TuneError(f"{path} trial {r['trial_id']}: activation_checkpointing "
                                f"{r['activation_checkpointing']!r} is not one of {', '.join(HAGEMANN_RECOMPUTE)}")
            error = r.get("error")
            if error is not None and "OOM" not in str(error):
                raise TuneError(f"{path} trial {r['trial_id']}: error {error!r} is not an OOM; say what it is")
            replay_rows.append(ReplayRow(
                tp=r["tp"], pp=r["pp"], dp=r["dp"], mbs=r["micro_batch"], recompute=recompute,
                zero=None, sp=bool(r["sequence_parallel"]), status="oom" if error else "ok",
                step_time_s=None if error else float(r["step_time_s"]), global_batch=HAGEMANN_GBS[seq],
                seq_len=seq, world=world, line=i + 1))
        out.append(PublishedTable(
            name=name, source=f"{path}: {first['file']} kernel {first['kernel']}", model=model, cluster=cluster,
            training=training, table=ReplayTable(path=path, table=name, rows=tuple(replay_rows)),
            assumptions=f"GBS {HAGEMANN_GBS[seq]} (implied by MFU x step time), bf16, Megatron-LM-like with the "
                        "distributed optimizer (ZeRO-1), flash attention "
                        + ("off" if first["kernel"] in HAGEMANN_NO_FLASH else "on")))
    return out


def read_tables(path: str) -> list[PublishedTable]:
    """Every table of a published YAML file (published_dev.yaml or hagemann_13b_dev.yaml)."""
    p = Path(path)
    if not p.is_file():
        raise TuneError(f"{path} does not exist")
    data = yaml.safe_load(p.read_text())
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise TuneError(f"{path}: expected a YAML list of runs (published_dev.yaml or hagemann_13b_dev.yaml)")
    if "trial_id" in data[0]:
        return _hagemann_tables(str(path), data)
    if "group" in data[0]:
        tables = _tr11_tables(str(path), data)
        if not tables:
            raise TuneError(f"{path}: no {TR11_GROUP} rows to replay")
        return tables
    raise TuneError(f"{path}: not a published_dev.yaml or hagemann_13b_dev.yaml list (no group/trial_id keys)")


def read_table(path: str, name: str | None) -> PublishedTable:
    tables = read_tables(path)
    names = [t.name for t in tables]
    if name is None:
        if len(tables) > 1:
            raise TuneError(f"--results {path} holds {len(tables)} tables; pick one with --results-table "
                            f"(e.g. {names[0]}; `python -m search.published_tables {path}` lists them)")
        return tables[0]
    for t in tables:
        if t.name == name:
            return t
    raise TuneError(f"--results-table {name!r} is not in {path}; tables: {', '.join(names)}")


CSV_HEADER = ("table", "tp", "pp", "dp", "micro_batch", "activation_recompute", "zero_stage", "sequence_parallel",
              "global_batch", "seq_len", "seconds_per_iteration", "memory_gb", "status")


def write_csv(t: PublishedTable, path: Path) -> None:
    """The table as a `search.replay` CSV (every configuration column the table records)."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_HEADER)
        for r in t.table.rows:
            zero = r.zero if r.zero is not None else (0 if r.dp == 1 else t.training.zero_options[0])
            w.writerow([t.name, r.tp, r.pp, r.dp, r.mbs, r.recompute or "", zero, int(bool(r.sp)), r.global_batch,
                        r.seq_len, "" if r.step_time_s is None else r.step_time_s,
                        "" if r.memory_gb is None else r.memory_gb, r.status])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m search.published_tables", description=__doc__.splitlines()[0])
    p.add_argument("path", help="published_dev.yaml or hagemann_13b_dev.yaml")
    p.add_argument("--out", help="write NAME.csv and NAME.model.yaml per table into this folder")
    args = p.parse_args(argv)
    try:
        tables = read_tables(args.path)
    except TuneError as err:
        print(f"published_tables: error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    for t in tables:
        ok = sum(r.status == "ok" for r in t.table.rows)
        model_arg = str(out / f"{t.name}.model.yaml") if out else f"{t.name}.model.yaml"
        results = str(out / f"{t.name}.csv") if out else args.path
        if out is not None:
            write_csv(t, out / f"{t.name}.csv")
            (out / f"{t.name}.model.yaml").write_text(yaml.safe_dump(model_to_yaml_dict(t.model), sort_keys=False))
        print(f"{t.name}: {len(t.table.rows)} rows ({ok} ok); {t.assumptions}")
        print("  tune " + " ".join([*t.tune_flags(model_arg), "--backend", "replay", "--results", results,
                                    "--results-table", t.name]))
    skipped = {s for t in tables for s in t.skipped}
    for rid, why in sorted(skipped):
        print(f"skipped {rid}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
