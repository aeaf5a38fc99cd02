"""The published measurement files (copies in tests/data) as replay tables, each with the setup to plan it.

    python -m search.published_tables tests/data/hagemann_13b_dev.yaml              # list the tables
    python -m search.published_tables tests/data/published_dev.yaml --out tables/    # CSV + model YAML + command
    >>> from search.published_tables import read_tables
    >>> for t in read_tables("tests/data/hagemann_13b_dev.yaml"): t.name, t.model, t.cluster, t.training, t.table

Two sources (README_published.md in that folder describes the fields):

- ``published_dev.yaml``, group ``bloom176b_tr11_prequel_topology_search`` (BigScience tr11 prequel,
  48x8 A100-80GB, Megatron-DeepSpeed, fp16, full recompute). One table per section of the chronicle
  and model shape (hidden, layers, heads) and node count: the rows a person compared on one machine.
  Rows whose model shape is not given get the layers/heads `published_runs` infers; rows the source flags
  (internally inconsistent, or "ran on different branches") are skipped, each with its reason. The
  other groups of that file are single runs of other frameworks, not tables.
- ``hagemann_13b_dev.yaml`` (Hagemann et al. 2023, Llama 13B on A100-80GB): one table per sheet and
  attention kernel; OOM rows are OOM outcomes.

Each row becomes planner inputs in `search.published_runs` (the one home of that conversion and of every
assumption it makes; each table's `PublishedTable.assumptions` names them).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from planner import ClusterSpec, ModelSpec, TrainingSpec
from planner.files import yaml_loaders
from planner.model import model_to_yaml_dict

from search import published_runs as runs
from search._base import TuneError
from search.replay import ReplayRow, ReplayTable

# the row -> planner inputs conversion and every assumption it makes: search.published_runs (one home)
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
        if not t.fused_norm:
            flags.append("--unfused-norm")   # Hagemann et al.'s sheets without their "RMS kernel"
        if t.attention_kernel:
            flags += ["--attention-kernel", t.attention_kernel]   # Hagemann's kernel column
        if t.eager_ops:
            flags.append("--eager-ops")   # Hagemann's trainer: element-wise ops as PyTorch ops
        if t.framework == "megatron-deepspeed":
            flags += ["--emit-flavor", t.flavor]    # the fork planned (Hagemann's: microsoft, with FlashAttention)
        return flags


def _zero(text: object) -> int:
    m = re.match(r"\s*(\d)", str(text))
    if not m:
        raise TuneError(f"zero_stage {text!r} does not start with a stage number")
    return int(m.group(1))


def _tr11_tables(path: str, rows: list[dict]) -> list[PublishedTable]:
    """One table per section of the chronicle (its PP=/DP= split merged), model shape and node count; runs the
    source warns about (different branches, inconsistent row) are skipped, each with its reason."""
    groups: dict[str, list[runs.PublishedRun]] = {}
    skipped: list[tuple[str, str]] = []
    for i, r in enumerate(rows, 1):
        if r.get("group") != runs.TR11_GROUP:
            continue
        _zero(r["parallel"]["zero_stage"])
        run = runs.tr11_run(r, i)
        if run.caveat is not None:
            skipped.append((run.id, run.caveat))
            continue
        m = run.model
        section = re.sub(r"\s*\(PP=\d+/DP=\d+\)", "", runs.tr11_section(str(r.get("notes", ""))))
        gbs = run.training.global_batch    # a replay table holds one global batch: the sweep's odd ones apart
        name = (f"tr11-{runs.slug(section)}-h{m.hidden}-l{m.layers}-a{m.heads}"
                f"-n{run.cluster.world_size // run.cluster.gpus_per_node}" + (f"-gbs{gbs}" if gbs != 2048 else ""))
        groups.setdefault(name, []).append(run)
    out = []
    for name, group in groups.items():
        first = group[0]
        zeros = tuple(sorted({g.cand.zero for g in group if g.cand.dp > 1} or {0}))
        training = replace(first.training, recompute_options=("full",), zero_options=zeros)
        replay_rows = tuple(ReplayRow(
            tp=g.cand.tp, pp=g.cand.pp, dp=g.cand.dp, mbs=g.cand.mbs, recompute="full", zero=g.cand.zero,
            status="ok", step_time_s=g.step_time_s, memory_gb=g.memory_gib,
            global_batch=g.training.global_batch, seq_len=g.training.seq_len, world=g.cluster.world_size,
            line=k + 1) for k, g in enumerate(group))
        out.append(PublishedTable(
            name=name, source=f"{path} group {runs.TR11_GROUP}: {', '.join(g.id for g in group)}",
            model=replace(first.model, name=name), cluster=first.cluster, training=training,
            table=ReplayTable(path=path, table=name, rows=replay_rows),
            assumptions="search.published_runs.tr11_run: full recompute, fp16, FFN 4h, ALiBi, inter-node "
                        f"{runs.JZ_A100_GBPS:g} Gb/s; layers/heads inferred where the table omits them",
            skipped=tuple(skipped)))
    return out


def _hagemann_tables(path: str, rows: list[dict]) -> list[PublishedTable]:
    """One table per sheet and attention kernel; OOM rows are OOM outcomes."""
    groups: dict[str, list[runs.PublishedRun]] = {}
    try:
        hag = runs.hagemann_runs(rows)
    except ValueError as err:
        raise TuneError(f"{path}: {err}") from None
    for r, run in zip(rows, hag):
        sheet = Path(str(r["file"])).stem.replace("llama_13B_", "").replace("_all_runs", "")
        groups.setdefault(f"hagemann-{runs.slug(sheet)}-{runs.slug(str(r['kernel']))}", []).append(run)
    out = []
    for name, group in groups.items():
        first = group[0]
        replay_rows = tuple(ReplayRow(
            tp=g.cand.tp, pp=g.cand.pp, dp=g.cand.dp, mbs=g.cand.mbs, recompute=g.cand.recompute, zero=None,
            sp=g.cand.sp, status="oom" if g.oom else "ok", step_time_s=g.step_time_s,
            global_batch=g.training.global_batch, seq_len=g.training.seq_len, world=g.cluster.world_size,
            line=k + 1) for k, g in enumerate(group))
        t = first.training
        out.append(PublishedTable(
            name=name, source=f"{path}: {rows[first.source_row - 1]['file']} kernel {rows[first.source_row - 1]['kernel']}",
            model=replace(first.model, name=name), cluster=first.cluster, training=t,
            table=ReplayTable(path=path, table=name, rows=replay_rows),
            assumptions=f"search.published_runs.hagemann_run: GBS {t.global_batch} (implied by MFU x step time), "
                        "bf16, 16-bit gradients + ZeRO-1 (Megatron-DeepSpeed), flash attention "
                        + ("on" if t.flash_attention else "off")
                        + (", norms fused" if t.fused_norm else ", norms as PyTorch ops (no RMS kernel)")
                        + f", attention kernel {t.attention_kernel or 'default'}"
                        + (", element-wise ops as PyTorch ops" if t.eager_ops else "")
                        + f", inter-node {runs.HAGEMANN_GBPS:g} Gb/s (assumed)"))
    return out


def read_tables(path: str) -> list[PublishedTable]:
    """Every table of a published YAML file (published_dev.yaml or hagemann_13b_dev.yaml)."""
    p = Path(path)
    if not p.is_file():
        raise TuneError(f"{path} does not exist")
    data = yaml.load(p.read_text(), Loader=yaml_loaders()[1])   # noqa: S506 - safe_load's, on libyaml
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise TuneError(f"{path}: expected a YAML list of runs (published_dev.yaml or hagemann_13b_dev.yaml)")
    if "trial_id" in data[0]:
        return _hagemann_tables(str(path), data)
    if "group" in data[0]:
        tables = _tr11_tables(str(path), data)
        if not tables:
            raise TuneError(f"{path}: no {runs.TR11_GROUP} rows to replay")
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
