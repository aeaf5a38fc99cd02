"""The hardware catalog: one entry per accelerator, every figure positive and sourced."""

from __future__ import annotations

import pytest

from planner.calibration import apply_calibration
from planner.errors import InputError
from planner.hardware import (CATALOG, CATALOG_FILE, accelerator_from, catalog, catalog_id_for_device,
                              get_accelerator, gpu_spelling, load_accelerators, load_cluster, make_cluster)

REQUIRED = {"V100-16GB", "V100-32GB", "A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200", "B200", "MI250X",
            "MI300X",
            # issue 21: the accelerators people rent now, and torchtitan's published H100s
            "L4", "L40S", "A10", "H100-NVL", "H800", "H20", "GH200", "GB200", "MI325X", "H100-HBM2e-96GB"}


def test_catalog_has_the_required_accelerators():
    assert REQUIRED <= set(CATALOG)


@pytest.mark.parametrize("acc", list(CATALOG.values()), ids=list(CATALOG))
def test_every_entry_is_complete_and_sourced(acc):
    assert acc.source and len(acc.source) > 20
    for name in ("memory_bytes", "peak_fp16_flops", "peak_fp32_flops", "memory_bw_bytes_per_s",
                 "intra_node_bw_bytes_per_s", "cuda_context_bytes", "sm_count"):
        assert getattr(acc, name) > 0, name
    assert 0 < acc.gemm_efficiency <= 1
    assert acc.peak_flops("fp16") >= acc.peak_flops("fp32")
    if acc.peak_bf16_flops is None:
        with pytest.raises(InputError):
            acc.peak_flops("bf16")


@pytest.mark.parametrize("gpu,bf16_tflops,mem_gib", [("A100-80GB", 312, 80), ("H100-SXM", 989, 80), ("H200", 989, 141),
                                                     ("V100-32GB", None, 32), ("MI300X", 1307.4, 192)])
def test_datasheet_figures(gpu, bf16_tflops, mem_gib):
    acc = get_accelerator(gpu)
    assert (acc.peak_bf16_flops / 1e12 if acc.peak_bf16_flops else None) == bf16_tflops
    assert acc.memory_bytes == mem_gib * 2**30


def test_unknown_gpu_lists_the_catalog():
    with pytest.raises(InputError) as err:
        get_accelerator("A200")
    assert "H100-SXM" in str(err.value)


def test_gpus_not_multiple_of_node_size():
    with pytest.raises(InputError) as err:
        make_cluster(gpu="A100-80GB", gpus=100)
    assert "96 or 104" in str(err.value)


def test_cluster_yaml_and_calibration(tmp_path):
    c = tmp_path / "c.yaml"
    c.write_text("gpu: H100-SXM\ngpus_per_node: 8\nnodes: 4\ninter_node_gbps: 3200\n")
    cluster = load_cluster(str(c))
    assert cluster.world_size == 32 and cluster.inter_node_bw_bytes_per_s == 400e9
    cal = tmp_path / "cal.yaml"
    cal.write_text("matmul_efficiency: 0.65\nintra_node_busbw_gbps: 2000\ncuda_context_bytes: 1000000000\n")
    calibrated = apply_calibration(cluster, str(cal))
    assert calibrated.matmul_efficiency == 0.65 and calibrated.intra_node_bw_bytes_per_s == 250e9
    assert calibrated.context_bytes == 1e9


@pytest.mark.parametrize("gpu,bf16_tflops,mem_gib,hbm_tbs", [("H100-NVL", 835, 94, 3.9), ("H200", 989, 141, 4.8),
                                                            ("B200", 2250, 180, 7.7), ("GB200", 2500, 186, 8.0)])
def test_accelerators_users_buy_now(gpu, bf16_tflops, mem_gib, hbm_tbs):
    acc = get_accelerator(gpu)
    assert acc.peak_bf16_flops == bf16_tflops * 1e12 and acc.memory_bytes == mem_gib * 2**30
    assert acc.memory_bw_bytes_per_s == pytest.approx(hbm_tbs * 1e12)


@pytest.mark.parametrize("preset,gpu,nics,gbps", [("jean-zay-a100", "A100-80GB", 4, 100),
                                                   ("dgx-a100-superpod", "A100-80GB", 8, 200),
                                                   ("dgx-h100-superpod", "H100-SXM", 8, 400)])
def test_cluster_presets_carry_their_network(preset, gpu, nics, gbps):
    cluster = load_cluster(preset, gpus=64)
    assert cluster.gpu.id == gpu and cluster.world_size == 64
    assert cluster.inter_node_bw_bytes_per_s == nics * gbps * 1e9 / 8
    assert f"{nics} x {gbps} Gb/s" in cluster.network_line()


def test_default_network_says_it_is_a_default():
    assert "default" in make_cluster(gpu="A100-80GB", gpus=16).network_line()


@pytest.mark.parametrize("device, gpu", [
    ("NVIDIA H100 80GB HBM3", "H100-SXM"),       # nvidia-smi / torch.cuda.get_device_name on the lent H100
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("NVIDIA H200", "H200"),
    ("Tesla V100-SXM2-32GB", "V100-32GB"),
])
def test_cuda_device_names_map_to_the_catalog(device, gpu):
    assert catalog_id_for_device(device) == gpu


def test_an_unknown_device_is_one_clear_error():
    with pytest.raises(InputError, match="no catalog entry"):
        catalog_id_for_device("Some Accelerator 9000")


# -- issue 21: the catalog is data, and a user's GPU YAML is read by the same code ------------------------------------
@pytest.mark.parametrize("gpu,bf16,fp8,mem_gib,hbm_gbs,intra_gbs", [
    ("L4", 121, 242.5, 24, 300, 32), ("L40S", 362.05, 733, 48, 864, 32), ("A10", 125, None, 24, 600, 32),
    ("H100-NVL", 835, 1670.5, 94, 3900, 300), ("H800", 989, 1979, 80, 3350, 200), ("H20", 148, 296, 96, 4000, 450),
    ("GH200", 989, 1979, 96, 4000, 450), ("GB200", 2500, 5000, 186, 8000, 900),
    ("MI325X", 1307.4, 2614.9, 256, 6000, 448),
    ("H100-HBM2e-96GB", 989, 1979, 96, 2400, 450),
])
def test_rented_accelerators_carry_their_datasheet_figures(gpu, bf16, fp8, mem_gib, hbm_gbs, intra_gbs):
    """Dense peaks (half the datasheets' "with sparsity" figures), memory, HBM and per-direction link bandwidth."""
    acc = get_accelerator(gpu)
    assert acc.peak_bf16_flops == pytest.approx(bf16 * 1e12) and acc.memory_bytes == mem_gib * 2**30
    assert (acc.peak_fp8_flops or None) == (pytest.approx(fp8 * 1e12) if fp8 else None)
    assert acc.memory_bw_bytes_per_s == pytest.approx(hbm_gbs * 1e9)
    assert acc.intra_node_bw_bytes_per_s == pytest.approx(intra_gbs * 1e9)
    assert "datasheet" in acc.source or "product brief" in acc.source or "torchtitan" in acc.source


def test_torchtitan_h100_is_the_published_96gb_500w_part():
    acc = get_accelerator("H100-96GB-500W")
    assert acc.id == "H100-HBM2e-96GB" and acc.power_w == 500 and acc.memory_bytes == 96 * 2**30
    assert "llama3_h100_202412_torchtitan.md" in acc.source


def test_power_capped_h100_sustains_the_cube_root_of_its_power_share():
    """Clocks go as the cube root of the power (dynamic power C·V²·f, the voltage scaled with the clock): the 500 W
    part sustains H100-SXM's GEMM rate at 700 W times (500/700)^(1/3); its peak so derated lies "between SXM and
    NVL" (torchtitan benchmarks/llama3_h100_202412_torchtitan.md), the two datasheets' 989 and 835 TFLOP/s."""
    capped, sxm, nvl = (get_accelerator(g) for g in ("H100-HBM2e-96GB", "H100-SXM", "H100-NVL"))
    share = (capped.power_w / sxm.power_w) ** (1 / 3)
    assert capped.gemm_efficiency == pytest.approx(sxm.gemm_efficiency * share, abs=5e-4)
    derated_peak = capped.peak_bf16_flops * capped.gemm_efficiency / sxm.gemm_efficiency
    assert nvl.peak_bf16_flops < derated_peak < sxm.peak_bf16_flops


def test_existing_entries_keep_their_network_defaults():
    """The default rail per GPU moved from a family table into each entry; the figures did not change."""
    for gpu, gbps in [("V100-32GB", 100), ("A100-80GB", 200), ("H100-SXM", 400), ("H100-PCIe", 400), ("H200", 400),
                      ("B200", 400), ("MI250X", 200), ("MI300X", 400), ("CPU", 100)]:
        cluster = make_cluster(gpu=gpu, gpus=16)
        assert cluster.gpus_per_node == 8 and cluster.inter_node_bw_bytes_per_s == gbps * 1e9 / 8 * 8, gpu
    # GB200: a compute tray of 4 GPUs, one 400G ConnectX-7 each, in a 72-GPU NVLink domain (DGX GB200 user guide)
    gb200 = make_cluster(gpu="GB200", gpus=16)
    assert (gb200.gpus_per_node, gb200.nvlink_domain, gb200.inter_node_bw_bytes_per_s) == (4, 72, 4 * 400e9 / 8)


def test_the_catalog_is_read_once_by_the_users_loader_and_is_read_only():
    assert catalog() is catalog() is CATALOG
    assert dict(catalog()) == load_accelerators(CATALOG_FILE)
    with pytest.raises(TypeError):
        catalog()["X"] = catalog()["A10"]   # type: ignore[index]


def test_no_two_catalog_names_read_alike():
    """--gpu reads a name however spelled (gpu_spelling); an id written exactly is answered without that map, which
    is the same answer only while no two ids or aliases of the catalog reduce to the same spelling."""
    names = [*catalog(), *(a for acc in catalog().values() for a in acc.aliases)]
    spellings = [gpu_spelling(n) for n in names]
    assert len(set(spellings)) == len(spellings), sorted(n for n, s in zip(names, spellings) if spellings.count(s) > 1)
    for name in names:
        assert get_accelerator(name.lower()) is get_accelerator(name) is catalog()[get_accelerator(name).id]


def test_the_catalog_builds_an_entry_when_asked_and_each_base_is_an_entry_above():
    """The catalog builds an entry (and its base) when first asked for, as `load_accelerators` builds it; a ``base``
    names an entry above it exactly, as a user's catalog must (its entries are built in order)."""
    from planner.files import read_mapping

    fresh = type(catalog())(read_mapping(CATALOG_FILE, "GPU file", packaged=True))
    h200 = fresh["H200"]
    assert set(fresh._built) == {"H200", "H100-SXM"} and h200 == catalog()["H200"]
    raw = read_mapping(CATALOG_FILE, "GPU file", packaged=True)
    for i, (acc_id, entry) in enumerate(raw.items()):
        assert "base" not in entry or entry["base"] in list(raw)[:i], acc_id


def test_variants_inherit_from_their_base():
    """``base`` keeps one home per fact: H200 is H100-SXM with its own memory and bandwidth."""
    h100, h200 = get_accelerator("H100-SXM"), get_accelerator("H200")
    assert h200.peak_bf16_flops == h100.peak_bf16_flops and h200.sm_count == h100.sm_count
    assert h200.memory_bytes == 141 * 2**30 and h200.source != h100.source


GPU_YAML = """id: MY-GPU
memory_gib: 64
bf16_tflops: 400
fp16_tflops: 400
fp32_tflops: 50
hbm_gb_per_s: 2000
intra_node_gb_per_s: 100
sm_count: 100
source: vendor sheet
"""


def test_gpu_yaml_file_is_a_gpu(tmp_path):
    f = tmp_path / "my_gpu.yaml"
    f.write_text(GPU_YAML)
    acc = get_accelerator(str(f))
    assert acc.id == "MY-GPU" and acc.memory_bytes == 64 * 2**30 and acc.peak_flops("bf16") == 400e12
    assert acc.peak_fp8_flops is None and acc.gpus_per_node == 8 and acc.gemm_efficiency == 0.7
    cluster = make_cluster(gpu=str(f), gpus=16)
    assert cluster.gpu == acc and cluster.nodes == 2


def test_gpu_yaml_with_a_base_changes_only_what_it_says(tmp_path):
    f = tmp_path / "capped.yaml"
    f.write_text("base: H100-SXM\nbf16_tflops: 800\npower_w: 500\n")
    acc = get_accelerator(str(f))
    h100 = get_accelerator("H100-SXM")
    assert acc.id == "capped" and acc.peak_bf16_flops == 800e12 and acc.memory_bytes == h100.memory_bytes
    assert acc.peak_fp8_flops == h100.peak_fp8_flops and "H100-SXM" in acc.source


@pytest.mark.parametrize("text,needle", [
    ("memry_gib: 64\n", "unknown key 'memry_gib' (did you mean 'memory_gib'?)"),
    (GPU_YAML.replace("memory_gib: 64", "memory_gib: -1"), "memory_gib must be GiB of device memory"),
    (GPU_YAML.replace("bf16_tflops: 400", "bf16_tflops: fast"), "bf16_tflops must be TFLOP/s"),
    (GPU_YAML.replace("hbm_gb_per_s: 2000\n", ""), "missing key hbm_gb_per_s"),
    ("base: Z9000\nmemory_gib: 1\n", "unknown GPU 'Z9000'"),
    (GPU_YAML.replace("sm_count: 100", "sm_count: 1.5"), "sm_count must be int"),
])
def test_a_bad_gpu_yaml_is_one_line_naming_the_key(tmp_path, text, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(InputError) as err:
        get_accelerator(str(f))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_cluster_yaml_describes_its_accelerator(tmp_path):
    inline = tmp_path / "inline.yaml"
    inline.write_text("name: lab\ngpus_per_node: 4\nnodes: 2\ngpu:\n  base: L40S\n  memory_gib: 46\n")
    cluster = load_cluster(str(inline))
    assert cluster.gpu.memory_bytes == 46 * 2**30 and cluster.gpu.peak_bf16_flops == 362.05e12
    assert cluster.world_size == 8
    (tmp_path / "my_gpu.yaml").write_text(GPU_YAML)
    beside = tmp_path / "beside.yaml"
    beside.write_text("gpu: my_gpu.yaml\nnodes: 3\n")   # a GPU YAML next to the cluster file
    assert load_cluster(str(beside)).gpu.id == "MY-GPU" and load_cluster(str(beside)).world_size == 24


def test_calibration_replaces_gpu_figures(tmp_path):
    cal = tmp_path / "cal.yaml"
    cal.write_text("matmul_efficiency: 0.6\ngpu:\n  memory_gib: 96\n  hbm_gb_per_s: 2400\n")
    cluster = apply_calibration(make_cluster(gpu="H100", gpus=8), str(cal))
    assert cluster.gpu.id == "H100-SXM" and cluster.gpu.memory_bytes == 96 * 2**30
    assert cluster.gpu.memory_bw_bytes_per_s == 2400e9 and cluster.gpu.peak_bf16_flops == 989e12
    cal.write_text("gpu:\n  memory_gb: 96\n")
    with pytest.raises(InputError, match="did you mean 'memory_gib'"):
        apply_calibration(make_cluster(gpu="H100", gpus=8), str(cal))


def test_a_description_round_trips_through_its_yaml_keys():
    for acc in catalog().values():
        back = accelerator_from(acc.to_yaml_dict(), "test")
        assert back == acc and back.aliases == acc.aliases


@pytest.mark.parametrize("device, gpu", [
    ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"), ("NVIDIA A10", "A10"), ("NVIDIA H100 NVL", "H100-NVL"),
    ("NVIDIA H800", "H800"), ("NVIDIA GH200 480GB", "GH200"), ("NVIDIA H100 PCIe", "H100-PCIe"),
    ("AMD Instinct MI325X", "MI325X"), ("NVIDIA B200", "B200"),
])
def test_new_device_names_map_to_their_own_entry(device, gpu):
    """A family matches a whole word: L4 is not L40S, A10 not A100, H200 not GH200."""
    assert catalog_id_for_device(device) == gpu


@pytest.mark.parametrize("gpus", [1, 2, 3, 4, 6, 7])
def test_fewer_gpus_than_a_node_plan_one_partial_node(gpus):
    cluster = make_cluster(gpu="H100", gpus=gpus)
    assert (cluster.nodes, cluster.gpus_per_node, cluster.world_size) == (1, gpus, gpus)
    assert cluster.intra_node_bw_bytes_per_s == get_accelerator("H100").intra_node_bw_bytes_per_s


@pytest.mark.parametrize("gpus,message", [(12, "use 8 or 16 (whole nodes)"), (100, "use 96 or 104"),
                                          (9, "use 8 or 16")])
def test_more_gpus_than_a_node_must_fill_whole_nodes(gpus, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_cluster(gpu="A100-80GB", gpus=gpus)


def test_node_size_defaults_to_the_accelerators():
    assert make_cluster(gpu="GH200", gpus=8).gpus_per_node == 4   # quad-GH200 nodes
    assert make_cluster(gpu="GH200", gpus=8, gpus_per_node=2).nodes == 4


def test_a_shipped_yaml_is_parsed_once_then_read_from_its_cache(tmp_path, monkeypatch):
    """planner.files.read_packaged: the catalog's parse kept beside the bytecode caches, stamped with the file's size
    and modification time; read back without parsing; parsed again once the file changes; none written under
    PYTHONDONTWRITEBYTECODE."""
    import sys

    from planner import files

    src = tmp_path / "catalog.yaml"
    src.write_text("A1:\n  memory_gib: 80\n  aliases: [a, b]\n  gemm_efficiency: 0.7\n  source: datasheet\n")
    want = {"A1": {"memory_gib": 80, "aliases": ["a", "b"], "gemm_efficiency": 0.7, "source": "datasheet"}}
    cache = tmp_path / "__pycache__" / f"catalog.yaml.{sys.implementation.cache_tag}.marshal"
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert files.read_packaged(src, "GPU file") == want and not cache.exists()
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert files.read_packaged(src, "GPU file") == want and cache.is_file()
    parse = files._parse_mapping
    monkeypatch.setattr(files, "_parse_mapping", lambda *a, **k: pytest.fail("parsed again"))
    got = files.read_packaged(src, "GPU file")
    assert got == want and type(got["A1"]["memory_gib"]) is int
    monkeypatch.setattr(files, "_parse_mapping", parse)
    src.write_text("A1:\n  memory_gib: 141\n")
    assert files.read_packaged(src, "GPU file") == {"A1": {"memory_gib": 141}}
    cache.write_bytes(b"not marshal data")
    assert files.read_packaged(src, "GPU file") == {"A1": {"memory_gib": 141}}
