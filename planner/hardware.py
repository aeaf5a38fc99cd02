"""The one hardware catalog (accelerators) and `ClusterSpec`.

Every figure is a dense (no sparsity) datasheet number with its source; units are in field
names, SI throughout (FLOP/s, bytes, bytes/s). Link bandwidths are per GPU, one direction.

    >>> from planner.hardware import get_accelerator
    >>> get_accelerator("A100-80GB").peak_bf16_flops / 1e12
    312.0
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


from planner.errors import InputError
from planner.files import read_mapping
from planner.schema import CLUSTER, check, check_world

TB = 1e12
GB = 1e9
GiB = 2**30


# gemm_efficiency, the sustained fraction of the dense peak for large bf16/fp16 GEMMs: ~0.8 on V100
# and A100 (NVIDIA "Matrix Multiplication Background" user guide, Fig. 2-3); ~0.7 on H100/H200/B200,
# whose datasheet peaks assume boost clocks a 700 W+ power cap does not hold under GEMM load
# (~700 of 989 TFLOP/s in public cuBLAS benchmarks); ~0.6 MI250X and ~0.5 MI300X (hipBLASLt bf16
# GEMMs reach ~650 of 1307 TFLOP/s in public MI300X-vs-H100 benchmarks, 2024).


@dataclass(frozen=True, slots=True, kw_only=True)
class Accelerator:
    id: str
    memory_bytes: float
    """device memory; datasheet "GB" of HBM is binary (nvidia-smi shows 81920 MiB on A100-80GB)"""
    sm_count: int
    """streaming multiprocessors / compute units: the wave size of GEMM tiles"""
    gemm_efficiency: float
    """fraction of the dense peak a large, well-shaped GEMM sustains (clocks under the power cap)"""
    peak_bf16_flops: float | None
    """dense bf16 tensor-core peak; None where the chip has no bf16 (V100)"""
    peak_fp16_flops: float
    peak_tf32_flops: float | None
    peak_fp32_flops: float
    memory_bw_bytes_per_s: float
    intra_node_bw_bytes_per_s: float
    """per-GPU, one-direction bandwidth of the intra-node link (NVLink / Infinity Fabric / PCIe)"""
    intra_node_link: str
    cuda_context_bytes: float
    """memory the runtime takes before the model (seed 003 'calibration': 1113 MiB on V100)"""
    source: str
    peak_fp8_flops: float | None = None
    """dense FP8 tensor-core peak (datasheet, no sparsity); None where the chip has no FP8"""

    def peak_flops(self, precision: str) -> float:
        """Dense peak for a training precision: bf16 | fp16 | fp32 (fp32 uses TF32 when the chip has it) | fp8."""
        if precision == "fp8":
            if self.peak_fp8_flops is None:
                raise InputError(f"{self.id} has no FP8 tensor cores; use --precision bf16")
            return self.peak_fp8_flops
        if precision == "bf16":
            if self.peak_bf16_flops is None:
                raise InputError(f"{self.id} has no bf16 support; use --precision fp16")
            return self.peak_bf16_flops
        if precision == "fp16":
            return self.peak_fp16_flops
        if precision == "fp32":
            return self.peak_tf32_flops or self.peak_fp32_flops
        raise InputError(f"unknown precision {precision!r}; use bf16, fp16 or fp32")


def _acc(**kw: object) -> Accelerator:
    return Accelerator(**kw)  # type: ignore[arg-type]


_V100 = dict(peak_bf16_flops=None, peak_fp16_flops=125 * TB, peak_tf32_flops=None, peak_fp32_flops=15.7 * TB,
             memory_bw_bytes_per_s=900 * GB, intra_node_bw_bytes_per_s=150 * GB, intra_node_link="NVLink2",
             cuda_context_bytes=1113 * 2**20, sm_count=80, gemm_efficiency=0.8,
             source="NVIDIA V100 datasheet (SXM2: 125 TFLOPS tensor, 15.7 FP32, 900 GB/s HBM2, NVLink 300 GB/s "
                    "bidirectional); context 1113 MiB measured in seed 003")
_A100 = dict(peak_bf16_flops=312 * TB, peak_fp16_flops=312 * TB, peak_tf32_flops=156 * TB, peak_fp32_flops=19.5 * TB,
             intra_node_bw_bytes_per_s=300 * GB, intra_node_link="NVLink3", cuda_context_bytes=0.9 * 2**30, sm_count=108,
             gemm_efficiency=0.8,
             source="NVIDIA A100 datasheet (312 TFLOPS bf16/fp16 dense, 156 TF32, 19.5 FP32, NVLink 600 GB/s "
                    "bidirectional); context 0.9 GiB with torch 1.13 per seed 001")
_H100_SXM = dict(peak_bf16_flops=989 * TB, peak_fp16_flops=989 * TB, peak_tf32_flops=494.5 * TB,
                 peak_fp32_flops=67 * TB, memory_bytes=80 * GiB, memory_bw_bytes_per_s=3350 * GB,
                 intra_node_bw_bytes_per_s=450 * GB, intra_node_link="NVLink4", cuda_context_bytes=0.9 * 2**30, sm_count=132,
                 gemm_efficiency=0.7, peak_fp8_flops=1979 * TB)   # H100/H200 SXM datasheets: 3958 TFLOPS FP8 with sparsity

CATALOG: dict[str, Accelerator] = {a.id: a for a in (
    _acc(id="V100-16GB", memory_bytes=16 * GiB, **_V100),
    _acc(id="V100-32GB", memory_bytes=32 * GiB, **_V100),
    _acc(id="A100-40GB", memory_bytes=40 * GiB, memory_bw_bytes_per_s=1555 * GB, **_A100),
    _acc(id="A100-80GB", memory_bytes=80 * GiB, memory_bw_bytes_per_s=2039 * GB, **_A100),
    _acc(id="H100-SXM", **_H100_SXM,
         source="NVIDIA H100 datasheet, SXM5 (989 TFLOPS bf16 dense, 494.5 TF32, 67 FP32, 80 GB HBM3 3.35 TB/s, "
                "NVLink 900 GB/s bidirectional)"),
    _acc(id="H100-PCIe", peak_bf16_flops=756 * TB, peak_fp16_flops=756 * TB, peak_tf32_flops=378 * TB,
         peak_fp32_flops=51 * TB, memory_bytes=80 * GiB, memory_bw_bytes_per_s=2000 * GB,
         intra_node_bw_bytes_per_s=64 * GB, intra_node_link="PCIe Gen5 x16", cuda_context_bytes=0.9 * 2**30, sm_count=114,
         gemm_efficiency=0.7, peak_fp8_flops=1513 * TB,   # datasheet: 3026 TFLOPS FP8 with sparsity
         source="NVIDIA H100 datasheet, PCIe (756 TFLOPS bf16 dense, 378 TF32, 51 FP32, 2.0 TB/s, "
                "PCIe Gen5 128 GB/s bidirectional)"),
    _acc(id="H100-NVL", peak_bf16_flops=835 * TB, peak_fp16_flops=835 * TB, peak_tf32_flops=417.5 * TB,
         peak_fp32_flops=60 * TB, memory_bytes=94 * GiB, memory_bw_bytes_per_s=3900 * GB,
         intra_node_bw_bytes_per_s=300 * GB, intra_node_link="NVLink bridge", cuda_context_bytes=0.9 * 2**30,
         sm_count=132, gemm_efficiency=0.7,
         source="NVIDIA H100 NVL datasheet (1,671 TFLOPS bf16 with sparsity = 835 dense, 835 TF32 sparse, 60 FP32, "
                "94 GB HBM3 3.9 TB/s, NVLink bridge 600 GB/s bidirectional)"),
    _acc(id="H200", **{**_H100_SXM, "memory_bytes": 141 * GiB, "memory_bw_bytes_per_s": 4800 * GB},
         source="NVIDIA H200 datasheet, SXM (989 TFLOPS bf16 dense, 141 GB HBM3e 4.8 TB/s, NVLink 900 GB/s)"),
    _acc(id="B200", peak_bf16_flops=2250 * TB, peak_fp16_flops=2250 * TB, peak_tf32_flops=1100 * TB,
         peak_fp32_flops=80 * TB, memory_bytes=180 * GiB, memory_bw_bytes_per_s=7700 * GB,
         intra_node_bw_bytes_per_s=900 * GB, intra_node_link="NVLink5", cuda_context_bytes=1.0 * 2**30, sm_count=148,
         gemm_efficiency=0.7, peak_fp8_flops=4500 * TB,   # HGX B200 datasheet: 72 PFLOPS FP8 sparse / 8 GPUs / 2
         source="NVIDIA HGX B200 datasheet (2.25 PFLOPS bf16 dense, 1.1 PF TF32, 180 GB HBM3e 7.7 TB/s, "
                "NVLink 1.8 TB/s bidirectional)"),
    _acc(id="GB200", peak_bf16_flops=2500 * TB, peak_fp16_flops=2500 * TB, peak_tf32_flops=1250 * TB,
         peak_fp32_flops=80 * TB, memory_bytes=186 * GiB, memory_bw_bytes_per_s=8000 * GB,
         intra_node_bw_bytes_per_s=900 * GB, intra_node_link="NVLink5 (NVL72 domain)", cuda_context_bytes=1.0 * 2**30,
         sm_count=148, gemm_efficiency=0.7,
         source="NVIDIA GB200 NVL72 datasheet, per GPU (/72): 360 PFLOPS bf16 with sparsity = 2.5 PF dense, "
                "180 PF TF32 sparse, 13.4 TB HBM3e = 186 GB at 576 TB/s = 8 TB/s, NVLink 130 TB/s = 1.8 TB/s "
                "bidirectional; FP32 per B200 (80 TF); one NVLink domain of 72 GPUs: --gpus-per-node 72"),
    _acc(id="MI250X", peak_bf16_flops=383 * TB, peak_fp16_flops=383 * TB, peak_tf32_flops=None,
         peak_fp32_flops=95.7 * TB, memory_bytes=128 * GiB, memory_bw_bytes_per_s=3277 * GB,
         intra_node_bw_bytes_per_s=200 * GB, intra_node_link="Infinity Fabric", cuda_context_bytes=1.0 * 2**30, sm_count=220,
         gemm_efficiency=0.6,
         source="AMD Instinct MI250X datasheet (383 TFLOPS bf16/fp16, 95.7 FP32 matrix, 128 GB HBM2e 3.2 TB/s, "
                "8 Infinity Fabric links 400 GB/s aggregate peer); one OAM = two GCDs"),
    _acc(id="MI300X", peak_bf16_flops=1307.4 * TB, peak_fp16_flops=1307.4 * TB, peak_tf32_flops=653.7 * TB,
         peak_fp32_flops=163.4 * TB, memory_bytes=192 * GiB, memory_bw_bytes_per_s=5300 * GB,
         intra_node_bw_bytes_per_s=448 * GB, intra_node_link="Infinity Fabric", cuda_context_bytes=1.0 * 2**30, sm_count=304,
         gemm_efficiency=0.5, peak_fp8_flops=2614.9 * TB,   # MI300X datasheet: 2614.9 TFLOPS FP8 dense
         source="AMD Instinct MI300X datasheet (1307.4 TFLOPS bf16 dense, 653.7 TF32, 163.4 FP32, 192 GB HBM3 "
                "5.3 TB/s, 7 Infinity Fabric links 896 GB/s bidirectional)"),
    # One CPU core as a "device": what CPU probes (gloo, one thread per rank) run on in tests.
    _acc(id="CPU", peak_bf16_flops=1.2 * TB, peak_fp16_flops=0.08 * TB, peak_tf32_flops=None,
         peak_fp32_flops=0.08 * TB, memory_bytes=8 * GiB, memory_bw_bytes_per_s=10 * GB,
         intra_node_bw_bytes_per_s=2 * GB, intra_node_link="shared memory (gloo)", cuda_context_bytes=0.3 * GiB,
         sm_count=1, gemm_efficiency=0.8,
         source="measured on a 2-core CI machine (fp32 matmul ~160 GFLOP/s for the "
                "machine, bf16 AMX 1.1-1.3 TFLOP/s per thread); memory per rank and link are round figures"),
)}

ALIASES = {"V100": "V100-32GB", "A100": "A100-80GB", "H100": "H100-SXM", "H100-80GB": "H100-SXM",
           "A100-SXM4-80GB": "A100-80GB", "A100-SXM4-40GB": "A100-40GB", "H100-94GB": "H100-NVL",
           "H200-141GB": "H200", "B200-180GB": "B200"}


def catalog_id_for_device(name: str) -> str:
    """The catalog id for a device name as CUDA reports it ('NVIDIA H100 80GB HBM3' -> 'H100-SXM'): the catalog id or
    alias sharing the family and the most of its other parts with the name (the shorter on a tie)."""
    upper = name.upper().replace(" ", "-")
    best, score = None, 0
    for key in [*CATALOG, *ALIASES]:
        parts = key.upper().split("-")
        if parts[0] not in upper:
            continue
        hits = sum(part in upper for part in parts)
        if hits > score or (hits == score and best is not None and len(key) < len(best)):
            best, score = key, hits
    if best is None:
        raise InputError(f"no catalog entry for the device {name!r}; add it to planner/hardware.py or give --gpu")
    return ALIASES.get(best, best)


def get_accelerator(gpu_id: str) -> Accelerator:
    """Exact catalog id (case-insensitive) or a listed alias; anything else fails with the list."""
    by_lower = {k.lower(): k for k in CATALOG} | {k.lower(): v for k, v in ALIASES.items()}
    key = by_lower.get(gpu_id.strip().lower())
    if key is None:
        raise InputError(f"unknown GPU {gpu_id!r}; known: {', '.join(CATALOG)}")
    return CATALOG[key]


# Inter-node defaults per GPU and direction: 200 Gb/s HDR InfiniBand per GPU (DGX A100 / SuperPOD:
# 8x HDR per node), 400 Gb/s NDR per GPU for H100/H200/B200 (DGX H100: 8x NDR400).
DEFAULT_INTER_NODE_GBPS = {"V100": 100.0, "A100": 200.0, "H100": 400.0, "H200": 400.0, "B200": 400.0, "GB200": 400.0,
                           "MI250X": 200.0, "MI300X": 400.0}


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    name: str
    gpu: Accelerator
    gpus_per_node: int
    nodes: int
    inter_node_bw_bytes_per_s: float
    """per node, one direction, all NICs (rails) together"""
    intra_node_bw_bytes_per_s: float
    """per GPU, one direction; defaults to the accelerator's link"""
    matmul_efficiency: float | None = None
    """base efficiency of the planner's GEMM shape model (large-GEMM fraction of peak, before tile/wave/short-k
    losses) fitted to this machine's timed GEMMs (planner.calibration); None: the catalog's gemm_efficiency"""
    host_scale: float = 1.0
    """this host's launch time relative to the frameworks' fitted host constants (planner.calibration)"""
    calibration: str = field(default="", compare=False)
    """the calibration file applied and what it changed, for the plan's output ("" when none)"""
    cuda_context_bytes: float | None = None
    nics_per_node: int | None = field(default=None, compare=False)
    """inter-node NICs (rails) per node, shared by the node's GPUs; None when only a total was given"""
    nic_gbps: float | None = field(default=None, compare=False)
    """one NIC's line rate, Gbit/s per direction"""
    network: str = field(default="", compare=False)
    """where the network figures come from (a preset's source, a flag, the default)"""
    intra_node_bw_measured: bool = False
    """intra_node_bw is a measured bus bandwidth (calibration): used as is, no link-efficiency derate"""
    inter_node_bw_measured: bool = False

    def __post_init__(self) -> None:
        if self.gpus_per_node <= 0 or self.nodes <= 0:
            raise InputError(f"cluster {self.name!r}: gpus per node and nodes must be > 0")

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def inter_node_bw_per_gpu(self) -> float:
        return self.inter_node_bw_bytes_per_s / self.gpus_per_node

    @property
    def context_bytes(self) -> float:
        return self.cuda_context_bytes if self.cuda_context_bytes is not None else self.gpu.cuda_context_bytes

    def network_line(self) -> str:
        """The network assumed, in one line: rails x rate per node, per GPU, the intra-node link, the source."""
        total = self.inter_node_bw_bytes_per_s * 8 / 1e9
        rails = (f"{self.nics_per_node} x {self.nic_gbps:g} Gb/s NICs per node = {total:g} Gb/s"
                 if self.nics_per_node and self.nic_gbps else f"{total:g} Gb/s per node")
        kind = "measured bus bandwidth" if self.inter_node_bw_measured else rails
        intra = (f"{self.intra_node_bw_bytes_per_s / 1e9:g} GB/s per GPU "
                 f"{'measured' if self.intra_node_bw_measured else self.gpu.intra_node_link}")
        return (f"network: {kind} ({self.inter_node_bw_per_gpu / 1e9:.1f} GB/s per GPU across nodes), "
                f"{intra} inside a node; {self.network or 'default'}")

    def to_dict(self) -> dict:
        d = {"name": self.name, "gpu": self.gpu.id, "gpus_per_node": self.gpus_per_node, "nodes": self.nodes,
             "inter_node_gbps": round(self.inter_node_bw_bytes_per_s * 8 / 1e9, 3),
             "intra_node_gbps_per_gpu": round(self.intra_node_bw_bytes_per_s * 8 / 1e9, 3)}
        if self.nics_per_node and self.nic_gbps:
            d |= {"nics_per_node": self.nics_per_node, "nic_gbps": self.nic_gbps}
        return d


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterPreset:
    """A cluster people train on, with its real node and network figures."""

    gpu: str
    gpus_per_node: int
    nics_per_node: int
    nic_gbps: float
    source: str


# Clusters people train on, with their real network (one home for these figures). `--cluster NAME`.
CLUSTER_PRESETS: dict[str, ClusterPreset] = {
    "jean-zay-a100": ClusterPreset(
        gpu="A100-80GB", gpus_per_node=8, nics_per_node=4, nic_gbps=100.0,
        source="Jean Zay gpu_p5 (IDRIS), BLOOM's cluster: 8 A100-SXM4-80GB on NVLink3 per node, "
               "4 x 100 Gb/s Omni-Path per node (BigScience tr11-176B-ml README)"),
    "jean-zay-v100": ClusterPreset(
        gpu="V100-32GB", gpus_per_node=4, nics_per_node=1, nic_gbps=100.0,
        source="Jean Zay V100 partition (IDRIS): 4 V100-SXM2-32GB per node, Omni-Path 100 Gb/s "
               "(one rail: an assumption, as examples/cluster-2x4-v100-32gb.yaml)"),
    "dgx-a100-superpod": ClusterPreset(
        gpu="A100-80GB", gpus_per_node=8, nics_per_node=8, nic_gbps=200.0,
        source="NVIDIA DGX A100 SuperPOD reference architecture (Selene): 8 x HDR 200 Gb/s InfiniBand "
               "compute rails per DGX A100, NVLink3/NVSwitch inside"),
    "dgx-h100-superpod": ClusterPreset(
        gpu="H100-SXM", gpus_per_node=8, nics_per_node=8, nic_gbps=400.0,
        source="NVIDIA DGX H100 SuperPOD reference architecture: 8 x NDR 400 Gb/s ConnectX-7 compute "
               "rails per DGX H100, NVLink4/NVSwitch inside"),
}
CLUSTER_PRESETS["selene"] = CLUSTER_PRESETS["dgx-a100-superpod"]


def make_cluster(*, gpu: str, gpus: int | None = None, gpus_per_node: int = 8, nodes: int | None = None,
                 inter_node_gbps: float | None = None, intra_node_gbps: float | None = None,
                 name: str = "", nics_per_node: int | None = None, nic_gbps: float | None = None,
                 network: str = "") -> ClusterSpec:
    """A cluster from flags: ``--gpu A100-80GB --gpus 384 --gpus-per-node 8``.

    The inter-node bandwidth per node is ``inter_node_gbps``, else ``nics_per_node`` x ``nic_gbps``,
    else the accelerator family's default rail (DEFAULT_INTER_NODE_GBPS, one NIC per GPU).
    """
    acc = get_accelerator(gpu)
    if gpus_per_node <= 0:
        raise InputError(f"--gpus-per-node must be > 0, got {gpus_per_node}")
    if nodes is None:
        if gpus is None or gpus <= 0:
            raise InputError(f"--gpus must be a positive integer, got {gpus}")
        if gpus % gpus_per_node:
            lo = gpus // gpus_per_node * gpus_per_node
            raise InputError(f"--gpus {gpus} is not a multiple of the node size {gpus_per_node}; "
                             f"use {lo or gpus_per_node} or {lo + gpus_per_node}, or set --gpus-per-node")
        nodes = gpus // gpus_per_node
    elif gpus is not None and gpus != nodes * gpus_per_node:
        raise InputError(f"--gpus {gpus} != nodes {nodes} x gpus per node {gpus_per_node}")
    check_world(nodes, gpus_per_node)
    if inter_node_gbps:
        inter, nics, rate = inter_node_gbps * 1e9 / 8, None, None
        network = network or "--inter-node-gbps"
    elif nics_per_node and nic_gbps:
        inter, nics, rate = nics_per_node * nic_gbps * 1e9 / 8, nics_per_node, nic_gbps
    else:
        family = acc.id.split("-")[0]
        rate = DEFAULT_INTER_NODE_GBPS.get(family, 100.0)
        inter, nics = rate * 1e9 / 8 * gpus_per_node, gpus_per_node
        network = network or (f"default for {family}: one {rate:g} Gb/s NIC per GPU (a DGX-like node); give "
                              "--cluster PRESET/FILE or --inter-node-gbps for your cluster")
    intra = intra_node_gbps * 1e9 / 8 if intra_node_gbps else acc.intra_node_bw_bytes_per_s
    return ClusterSpec(name=name or f"{nodes}x{gpus_per_node} {acc.id}", gpu=acc, gpus_per_node=gpus_per_node,
                       nodes=nodes, inter_node_bw_bytes_per_s=inter, intra_node_bw_bytes_per_s=intra,
                       nics_per_node=nics, nic_gbps=rate, network=network)


def preset_cluster(preset: str, *, gpus: int | None = None, nodes: int | None = None) -> ClusterSpec:
    """A cluster preset (CLUSTER_PRESETS) at ``gpus`` / ``nodes`` (default: one node)."""
    p = CLUSTER_PRESETS[preset]
    if gpus is None and nodes is None:
        nodes = 1
    return make_cluster(gpu=p.gpu, gpus=gpus, nodes=nodes, gpus_per_node=p.gpus_per_node,
                        nics_per_node=p.nics_per_node, nic_gbps=p.nic_gbps, name=preset,
                        network=f"preset {preset}: {p.source}")


def load_cluster(path: str, *, gpus: int | None = None, nodes: int | None = None) -> ClusterSpec:
    """A cluster YAML (gpu, gpus_per_node, nodes, inter_node_gbps per node or nics_per_node x nic_gbps,
    intra_node_gbps per GPU), or the name of a preset (CLUSTER_PRESETS: jean-zay-a100, dgx-h100-superpod, ...)."""
    if path.strip().lower() in CLUSTER_PRESETS:
        return preset_cluster(path.strip().lower(), gpus=gpus, nodes=nodes)
    d = check(read_mapping(path, "cluster file"), CLUSTER, f"cluster YAML {path}")
    if nodes is None and gpus is None:
        nodes = d.get("nodes")
    return make_cluster(gpu=d["gpu"], gpus=gpus, gpus_per_node=d.get("gpus_per_node", 8), nodes=nodes,
                        inter_node_gbps=d.get("inter_node_gbps"), intra_node_gbps=d.get("intra_node_gbps"),
                        nics_per_node=d.get("nics_per_node"), nic_gbps=d.get("nic_gbps"), name=d.get("name", ""),
                        network=f"cluster file {path}" + (f": {d['source']}" if d.get("source") else ""))
