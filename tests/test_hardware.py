"""The hardware catalog: one entry per accelerator, every figure positive and sourced."""

from __future__ import annotations

import pytest

from planner.calibration import apply_calibration
from planner.errors import InputError
from planner.hardware import CATALOG, catalog_id_for_device, get_accelerator, load_cluster, make_cluster

REQUIRED = {"V100-16GB", "V100-32GB", "A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200", "B200", "MI250X",
            "MI300X"}


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
