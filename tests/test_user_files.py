"""A new user's run from a published config.json (issue 31): what `plan` says and what `--emit` writes agree, in
plan.yaml as in the framework's files; a run longer than the file's positions is said at plan time and emitted with
them raised. `plan` runs in-process (planner.cli.main), as its console script does."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"


def plan(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _args(text: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split()[1:] for line in text.splitlines()}


def test_plan_yaml_carries_the_files_positions_and_the_runs_length(tmp_path, capsys):
    """Issue 31.3: with --seq-len 8192 plan.yaml said max_position_embeddings 4096 and "seq_len 4096 assumed", while
    args.txt beside it had the file's 131,072."""
    code, _, err = plan(capsys, "--model", str(FIXTURES / "Llama-3.1-8B.json"), "--gpus", "8", "--gpu", "H100",
                        "--seq-len", "8192", "--global-batch", "64", "--emit", "megatron-lm", "--out", str(tmp_path))
    assert code == 0, err
    doc = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    args = _args((tmp_path / "args.txt").read_text())
    assert (doc["seq_length"], doc["max_position_embeddings"]) == (8192, 131072)
    assert args["--max-position-embeddings"] == ["131072"] and args["--seq-length"] == ["8192"]
    model = doc["plantune"]["model"]
    assert model["seq_len"] == 8192 and "seq_len 8192 from --seq-len" in model["source"]
    assert "assumed" not in model["source"] and "assumed" not in err
    # and read back: `plan --from plan.yaml --emit` writes the same arguments
    code, _, err = plan(capsys, "--from", str(tmp_path / "plan.yaml"), "--emit", "megatron-lm", "--out",
                        str(tmp_path / "again"))
    assert code == 0, err
    assert (tmp_path / "again" / "args.txt").read_text() == (tmp_path / "args.txt").read_text()


def test_a_plan_file_whose_positions_disagree_is_refused(tmp_path, capsys):
    code, _, err = plan(capsys, "--model", str(FIXTURES / "Llama-3.1-8B.json"), "--gpus", "8", "--gpu", "H100",
                        "--global-batch", "64", "--emit", "megatron-lm", "--out", str(tmp_path))
    assert code == 0, err
    text = (tmp_path / "plan.yaml").read_text().replace("max_position_embeddings: 131072",
                                                         "max_position_embeddings: 4096")
    (tmp_path / "plan.yaml").write_text(text)
    code, _, err = plan(capsys, "--from", str(tmp_path / "plan.yaml"))
    assert code == 2 and err.count("\n") == 1 and "max_position_embeddings 4096 disagrees" in err


def test_a_run_longer_than_the_files_positions_is_said_and_emitted_with_them_raised(tmp_path, capsys):
    """Issue 31.4: phi-4's file has 16,384 positions; --seq-len 32768 was planned silently, then refused by --emit
    with advice about a YAML key. Now plan says it in one line and emit writes the raised positions (what a run
    trained from scratch at that length has), plan.yaml's header saying it too."""
    base = ["--model", str(FIXTURES / "phi-4.json"), "--gpus", "64", "--gpu", "H100", "--seq-len", "32768",
            "--global-batch", "64", "--framework", "megatron-lm"]
    code, out, err = plan(capsys, *base)
    assert code == 0, err
    said = [line for line in err.splitlines() if "max_position_embeddings raised" in line]
    assert len(said) == 1 and "from 16384 to 32768 for --seq-len 32768" in said[0]
    code, _, err = plan(capsys, *base, "--emit", "megatron-lm", "--out", str(tmp_path))
    assert code == 0, err
    args = _args((tmp_path / "args.txt").read_text())
    assert args["--max-position-embeddings"] == ["32768"] and args["--seq-length"] == ["32768"]
    assert "# phi-4: max_position_embeddings raised from 16384 to 32768" in (tmp_path / "plan.yaml").read_text()
    assert yaml.safe_load((tmp_path / "plan.yaml").read_text())["max_position_embeddings"] == 32768


@pytest.mark.parametrize("emit", [[], ["--emit", "megatron-lm"]])
def test_a_learned_position_table_is_not_raised_and_both_refuse(tmp_path, capsys, emit):
    """GPT-2's 1,024 learned positions are rows of its weights: plan and emit refuse --seq-len 2048 alike."""
    code, out, err = plan(capsys, "--model", str(FIXTURES / "gpt2-large.json"), "--gpus", "8", "--gpu", "H100",
                          "--seq-len", "2048", "--global-batch", "64", *emit,
                          *(["--out", str(tmp_path)] if emit else []))
    assert code == 2 and err.count("\n") == 1 and "over gpt2-large's 1024 learned positions" in err
    assert "--seq-len <= 1024" in err and not list(tmp_path.iterdir())


def test_a_config_json_saved_from_a_repository_names_its_tokenizer(tmp_path, capsys):
    """A config.json saved by transformers carries _name_or_path: the launcher's TOKENIZER defaults to that
    repository (issue 31.7); a local path there is not taken for one."""
    import json

    d = json.loads((FIXTURES / "Llama-3.1-8B.json").read_text())
    for name, hub in (("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B"), ("/home/me/llama", "")):
        (tmp_path / "config.json").write_text(json.dumps({**d, "_name_or_path": name}))
        out = tmp_path / ("run" + str(bool(hub)))
        code, _, err = plan(capsys, "--model", str(tmp_path / "config.json"), "--gpus", "8", "--gpu", "H100",
                            "--global-batch", "64", "--emit", "megatron-lm", "--out", str(out))
        assert code == 0, err
        text = (out / "launch.sbatch").read_text()
        assert (f"TOKENIZER=${{TOKENIZER:-{hub}}}" in text) == bool(hub)
        assert ("TOKENIZER=${TOKENIZER:?set TOKENIZER" in text) == (not hub)
        assert yaml.safe_load((out / "plan.yaml").read_text())["plantune"]["model"].get("hub_id", "") == hub


# -- names people type (issue 31.8) -------------------------------------------------------------------------------

@pytest.mark.parametrize("typed,catalog_id", [("A10G", "A10G"), ("H100-SXM5", "H100-SXM"), ("H100 80GB", "H100-SXM"),
                                              ("A100-40G", "A100-40GB"), ("RTX4090", "RTX-4090"),
                                              ("RTX-A6000", "RTX-A6000"), ("rtx 4090", "RTX-4090"),
                                              ("a100_80gb", "A100-80GB")])
def test_gpu_names_people_type(typed, catalog_id):
    from planner.hardware import get_accelerator

    assert get_accelerator(typed).id == catalog_id


def test_the_added_gpus_carry_their_datasheet_figures():
    """RTX A6000 datasheet: 309.7 TFLOPS tensor with sparsity, 48 GB at 768 GB/s; the Ada whitepaper's RTX 4090:
    165.2 bf16 dense, 24 GB at 1,008 GB/s; the A10G: the A10's memory (600 GB/s), its peaks an upper bound."""
    from planner.hardware import get_accelerator

    a6000, r4090, a10g = (get_accelerator(g) for g in ("RTX-A6000", "RTX-4090", "A10G"))
    assert (a6000.peak_bf16_flops * 2, a6000.memory_bytes / 2**30, a6000.memory_bw_bytes_per_s) == (309.7e12, 48,
                                                                                                    768e9)
    assert (r4090.peak_bf16_flops, r4090.peak_fp8_flops, r4090.memory_bw_bytes_per_s) == (165.2e12, 330.3e12, 1008e9)
    assert a10g.memory_bw_bytes_per_s == get_accelerator("A10").memory_bw_bytes_per_s == 600e9
    assert "upper bound" in a10g.source and a6000.peak_fp8_flops is None


@pytest.mark.parametrize("device,catalog_id", [("NVIDIA A10G", "A10G"), ("NVIDIA A10", "A10"),
                                               ("NVIDIA GeForce RTX 4090", "RTX-4090"),
                                               ("NVIDIA RTX A6000", "RTX-A6000")])
def test_the_added_gpus_as_cuda_names_them(device, catalog_id):
    """What torch.cuda.get_device_name reports (tune calibrate) finds the new entries, the A10G not taken for the
    A10."""
    from planner.hardware import catalog_id_for_device

    assert catalog_id_for_device(device) == catalog_id


def test_an_unknown_gpu_says_the_nearest_name(capsys):
    code, _, err = plan(capsys, "--model", "176B", "--gpus", "8", "--gpu", "H100-SMX")
    assert code == 2 and err.count("\n") == 1 and "unknown GPU 'H100-SMX' (did you mean 'H100-SXM'?)" in err


def test_a_mistyped_flag_says_the_nearest_one(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--model", "176B", "--gpus", "8", "--gloabl-batch", "8"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "did you mean --global-batch?" in err
    assert err.count("did you mean") == 1 and err.count("\n") == 1


def test_a_mistyped_replay_column_says_the_nearest_one(tmp_path):
    from search._base import TuneError
    from search.replay import ReplayTable

    (tmp_path / "r.csv").write_text("tp,pp,dp,micro_batch,status,seconds_per_iteraton\n1,1,8,1,ok,2.0\n")
    with pytest.raises(TuneError, match=r"column 'seconds_per_iteraton' is not understood \(did you mean "
                                        r"'seconds_per_iteration'\?\)"):
        ReplayTable.read(str(tmp_path / "r.csv"))


def _snapshot(root: Path, repo: str, fixture: str, commit: str = "0123abcd") -> Path:
    """A repository in huggingface_hub's cache layout: refs/main naming the snapshot that holds config.json."""
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "snapshots" / commit).mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    (folder / "snapshots" / commit / "config.json").write_text((FIXTURES / fixture).read_text())
    return folder / "snapshots" / commit


def test_a_model_folder_or_a_cached_repository_is_read(tmp_path, monkeypatch, capsys):
    """A snapshot folder holding config.json, or the repository id when the local cache (HF_HUB_CACHE) has it: read
    as the file, named after the repository, whose id becomes the launcher's tokenizer."""
    from planner.model import load_model

    snap = _snapshot(tmp_path / "hub", "Qwen/Qwen2.5-7B", "Qwen2.5-7B.json")
    by_file = load_model(str(FIXTURES / "Qwen2.5-7B.json"))
    for given in (str(snap), "Qwen/Qwen2.5-7B"):
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
        m = load_model(given)
        assert (m.name, m.hub_id, m.params, m.vocab) == ("Qwen2.5-7B", "Qwen/Qwen2.5-7B", by_file.params, by_file.vocab)
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))   # $HF_HOME/hub
    code, _, err = plan(capsys, "--model", "Qwen/Qwen2.5-7B", "--gpus", "8", "--gpu", "H100", "--global-batch", "64",
                        "--emit", "megatron-lm", "--out", str(tmp_path / "run"))
    assert code == 0, err
    assert "TOKENIZER=${TOKENIZER:-Qwen/Qwen2.5-7B}" in (tmp_path / "run" / "launch.sbatch").read_text()
    code, _, err = plan(capsys, "--model", "Qwen/Qwen2.5-72B", "--gpus", "8")
    assert code == 2 and err.count("\n") == 1 and "not a preset, a file, or a repository in the local" in err
    assert "huggingface-cli download Qwen/Qwen2.5-72B config.json" in err
    (tmp_path / "empty").mkdir()
    code, _, err = plan(capsys, "--model", str(tmp_path / "empty"), "--gpus", "8")
    assert code == 2 and "holds no config.json" in err
