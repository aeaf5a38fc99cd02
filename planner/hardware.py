"""The accelerator catalog, `ClusterSpec` and the cluster presets.

The catalog is data, planner/accelerators.yaml, read once per process, each entry built when first asked for by
`accelerator_from`, the code that reads a user's GPU YAML (``--gpu my_gpu.yaml``, a cluster YAML's ``gpu``, a
calibration's ``gpu``) with `load_accelerators`.
Every figure is a dense (no sparsity) datasheet number with its source; `Accelerator` fields are SI
(FLOP/s, bytes, bytes/s), the YAML keys name their unit. Link bandwidths are per GPU, one direction.

    >>> from planner.hardware import get_accelerator
    >>> get_accelerator("A100-80GB").peak_bf16_flops / 1e12
    312.0
"""

from __future__ import annotations

import json
import functools
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from planner.errors import InputError
from planner.files import read_mapping
from planner.schema import ACCELERATOR, CLUSTER, check, check_world, describe

TB = 1e12
GB = 1e9
GiB = 2**30

CATALOG_FILE = Path(__file__).with_name("accelerators.yaml")
"""the built-in catalog: data, read by the same `load_accelerators` as a user's GPU file"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Accelerator:
    """One accelerator's datasheet figures (planner/accelerators.yaml, or a user's GPU YAML), in SI units."""

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
    peak_fp8_flops: float | None
    """dense FP8 tensor-core peak (datasheet, no sparsity); None where the chip has no FP8"""
    gpus_per_node: int
    """the usual node (NVLink domain) size: the default of --gpus-per-node"""
    nic_gbps: float
    """the usual inter-node NIC per GPU, Gbit/s per direction: the default network"""
    nvlink_domain: int | None = None
    """GPUs one NVLink fabric joins when it is larger than the node (GB200 NVL72: 72 GPUs over 18 trays of 4);
    None: the node is the domain. The default of --nvlink-domain"""
    mx_block_scaling: bool = False
    """the tensor cores take MX block scales (OCP Microscaling: a shared E8M0 scale per 32 elements) in the GEMM
    itself: Blackwell (MXFP8 in Transformer Engine, --fp8-recipe mxfp8) and AMD CDNA4 (MI355X)"""
    host_memory_bytes: float | None = None
    """the usual node's host (CPU) memory, all ``gpus_per_node`` GPUs' together (DGX H100: 2 TiB); None: not in the
    catalog, the host-memory rule then checks nothing (`ClusterSpec.host_memory_bytes`)"""
    host_memory_bw_bytes_per_s: float | None = None
    """the usual node's host memory bandwidth, all its CPU sockets' channels together (DGX H100: 2 x 8 DDR5-4800
    channels, 614 GB/s); None: not in the catalog (`planner.offload.host_memory_bw_per_gpu` then takes the DGX
    H100's)"""
    host_link_bw_bytes_per_s: float = 64e9
    """the GPU's link to its host memory, one direction: PCIe (Gen5 x16 64 GB/s, Gen4 32, Gen3 16) or NVLink-C2C on
    Grace (GH200 450 GB/s); what activation offload and the CPU optimizer offload copy over (planner.offload)"""
    attention_tflops: str | None = None
    """the attention core's published forward + backward rates by kernel, head dim, mask and sequence length
    (accelerators.yaml ``attention_tflops``, frozen: `freeze`); read by planner.attention; None: none published"""
    power_w: float | None = field(compare=False)
    aliases: tuple[str, ...] = field(compare=False)
    """other names --gpu accepts (A100 -> A100-80GB)"""

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

    def to_yaml_dict(self) -> dict:
        """This accelerator in the keys of a GPU YAML (planner/accelerators.yaml): read back by `accelerator_from`."""
        d: dict = {"id": self.id}
        for key, (name, unit) in ACCELERATOR_KEYS.items():
            value = getattr(self, name)
            d[key] = (thaw(value) if key == "attention_tflops" else list(value) if isinstance(value, tuple)
                      else value / unit if unit and value is not None else value)
        return d


def freeze(value: object) -> str | None:
    """A YAML mapping as canonical JSON text: hashable for the frozen `Accelerator`, and a str caches its hash (a
    ClusterSpec is hashed on every cached lookup); `thaw` reverses it."""
    return None if value is None else json.dumps(value, sort_keys=True)


def thaw(value: str | None) -> object:
    """`freeze`'s text back as the mapping."""
    return None if value is None else json.loads(value)


# GPU YAML key -> (Accelerator field, unit the YAML number is in): one table for reading and writing
ACCELERATOR_KEYS: dict[str, tuple[str, float | None]] = {
    "memory_gib": ("memory_bytes", GiB), "bf16_tflops": ("peak_bf16_flops", TB),
    "fp16_tflops": ("peak_fp16_flops", TB), "fp8_tflops": ("peak_fp8_flops", TB),
    "tf32_tflops": ("peak_tf32_flops", TB), "fp32_tflops": ("peak_fp32_flops", TB),
    "hbm_gb_per_s": ("memory_bw_bytes_per_s", GB), "intra_node_gb_per_s": ("intra_node_bw_bytes_per_s", GB),
    "intra_node_link": ("intra_node_link", None), "gpus_per_node": ("gpus_per_node", None),
    "nic_gbps": ("nic_gbps", None), "nvlink_domain": ("nvlink_domain", None),
    "mx_block_scaling": ("mx_block_scaling", None), "sm_count": ("sm_count", None),
    "gemm_efficiency": ("gemm_efficiency", None), "attention_tflops": ("attention_tflops", None),
    "cuda_context_gib": ("cuda_context_bytes", GiB), "host_memory_gib": ("host_memory_bytes", GiB),
    "host_memory_gb_per_s": ("host_memory_bw_bytes_per_s", GB), "host_link_gb_per_s": ("host_link_bw_bytes_per_s", GB),
    "power_w": ("power_w", None),
    "source": ("source", None),
    "aliases": ("aliases", None),
}
ACCELERATOR_DEFAULTS = {"bf16_tflops": None, "fp8_tflops": None, "tf32_tflops": None, "intra_node_link": "",
                        "gpus_per_node": 8, "nic_gbps": 100.0, "nvlink_domain": None, "mx_block_scaling": False,
                        "gemm_efficiency": 0.7, "cuda_context_gib": 1.0, "attention_tflops": None,
                        "host_memory_gib": None,
                        "host_memory_gb_per_s": None,
                        "host_link_gb_per_s": 64,
                        "power_w": None, "source": "", "aliases": []}
"""what a description without ``base`` may leave out: no bf16/FP8/TF32 peak; gemm_efficiency 0.7, the H100-class
figure (planner/accelerators.yaml says where each comes from); one 100 Gb/s NIC per GPU; a 1 GiB CUDA context; a
PCIe Gen5 x16 host link"""


def accelerator_from(value: object, where: str, *, known: Mapping[str, Accelerator] | None = None,
                     default_id: str = "") -> Accelerator:
    """An accelerator from what a user wrote: a catalog id or alias, a path to a GPU YAML, or a mapping of GPU YAML
    keys (ACCELERATOR_KEYS; ``base: ID`` starts from another entry and changes only the keys given)."""
    if isinstance(value, str):
        return get_accelerator(value, known=known)
    if not isinstance(value, dict):
        raise InputError(f"{where} must be a catalog id (e.g. H100-SXM), a path to a GPU YAML, or a mapping "
                         f"describing the accelerator, got {value!r}")
    d = check(value, ACCELERATOR, where)
    if "base" in d:
        fields = get_accelerator(d["base"], known=known).to_yaml_dict() | {"aliases": [], "source": ""}
    else:
        missing = [k for k in ACCELERATOR_KEYS if k not in d and k not in ACCELERATOR_DEFAULTS]
        if missing:
            raise InputError(f"{where}: missing key {missing[0]} ({describe(ACCELERATOR[missing[0]])}); give it from "
                             "the datasheet, or add base: ID to start from a catalog entry (planner/accelerators.yaml)")
        fields = dict(ACCELERATOR_DEFAULTS)
    fields |= {k: v for k, v in d.items() if k not in ("base", "id")}
    acc_id = d.get("id") or default_id
    if not acc_id:
        raise InputError(f"{where}: missing key id (text); name the accelerator, e.g. id: MY-GPU")
    kw = {name: (tuple(fields[key]) if key == "aliases" else freeze(fields[key]) if key == "attention_tflops" else
                 fields[key] * unit if unit and fields[key] is not None else fields[key])
          for key, (name, unit) in ACCELERATOR_KEYS.items()}
    kw["source"] = kw["source"] or (f"{where} on top of {d['base']}" if "base" in d else where)
    return Accelerator(id=acc_id, **kw)


def load_accelerators(path: str | Path, *, known: Mapping[str, Accelerator] | None = None) -> dict[str, Accelerator]:
    """A GPU YAML: one accelerator (its keys at the top level; id defaults to the file's name), or a catalog of them
    (id -> description, as planner/accelerators.yaml); ``base`` names an entry above or one of ``known``."""
    d = read_mapping(path, "GPU file", packaged=Path(path) == CATALOG_FILE)
    if not d or not all(isinstance(v, dict) for v in d.values()):   # one accelerator: its keys hold values
        acc = accelerator_from(d, f"GPU file {path}", known=known, default_id=Path(path).stem)
        return {acc.id: acc}
    out: dict[str, Accelerator] = {}
    for acc_id, entry in d.items():
        out[str(acc_id)] = accelerator_from(entry, f"GPU file {path}: {acc_id}", known={**(known or {}), **out},
                                            default_id=str(acc_id))
    return out


class _Catalog(Mapping):
    """The built-in catalog as `load_accelerators` reads it, each entry built from the YAML's mapping when first
    asked for (a plan asks for one or two of the 25: building them all was ~2 ms of `plan`'s start-up); read-only.
    A ``base`` may name any entry of the file (`load_accelerators`: one above)."""

    def __init__(self, raw: Mapping[str, dict]) -> None:
        self._raw = raw
        self._built: dict[str, Accelerator] = {}   # a memo: what `accelerator_from` gives for an entry, once

    def __getitem__(self, key: str) -> Accelerator:
        acc = self._built.get(key)
        if acc is None:
            acc = self._built[key] = accelerator_from(self._raw[key], f"GPU file {CATALOG_FILE}: {key}", known=self,
                                                      default_id=key)
        return acc

    def __iter__(self):
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


@functools.cache
def catalog() -> Mapping[str, Accelerator]:
    """The built-in catalog (planner/accelerators.yaml), read once per process, read-only, each entry built when
    first asked for (`_Catalog`)."""
    raw = read_mapping(CATALOG_FILE, "GPU file", packaged=True)
    if not raw or not all(isinstance(k, str) and isinstance(v, dict) for k, v in raw.items()):
        return MappingProxyType(load_accelerators(CATALOG_FILE))   # not a catalog of entries: as a user's file
    return _Catalog(raw)


def __getattr__(name: str) -> object:   # `CATALOG` reads the YAML when first asked for, not at import
    if name == "CATALOG":
        return catalog()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def accelerator_ref(acc: Accelerator) -> str | dict:
    """What a written file (plan.yaml) says for ``acc``: its catalog id, or its whole description when it is not
    the catalog's entry (a user's GPU YAML, a calibrated figure); `accelerator_from` reads either back."""
    return acc.id if catalog().get(acc.id) == acc else acc.to_yaml_dict()


def _aliases(known: Mapping[str, Accelerator]) -> dict[str, str]:
    return {alias: acc.id for acc in known.values() for alias in acc.aliases}


def catalog_id_for_device(name: str) -> str:
    """The catalog id for a device name as CUDA reports it ('NVIDIA H100 80GB HBM3' -> 'H100-SXM'): the catalog id or
    alias whose family (first part) is a whole word of the name (L4 is not L40S, H200 not GH200) and which shares the
    most of its other parts with the name (the shorter on a tie)."""
    known = catalog()
    aliases = _aliases(known)
    upper = name.upper().replace(" ", "-")
    words = set(upper.split("-"))
    best, score = None, 0
    for key in [*known, *aliases]:
        parts = key.upper().split("-")
        if parts[0] not in words:
            continue
        hits = sum(part in upper for part in parts)
        if hits > score or (hits == score and best is not None and len(key) < len(best)):
            best, score = key, hits
    if best is None:
        raise InputError(f"no catalog entry for the device {name!r}; describe it in a GPU YAML and give --gpu FILE "
                         "(keys as in planner/accelerators.yaml)")
    return aliases.get(best, best)


def gpu_spelling(name: str) -> str:
    """A GPU name as people type it, reduced for lookup: case, spaces, '-' and '_' dropped, a memory size's G read as
    GB ("H100 80GB", "h100-80gb", "A100-40G", "RTX4090" and "rtx 4090" match the catalog's H100-80GB, A100-40GB,
    RTX-4090)."""
    return re.sub(r"(\d)G(?!B)", r"\1GB", name.strip().upper()).replace(" ", "").replace("-", "").replace("_", "")


def get_accelerator(gpu_id: str, *, known: Mapping[str, Accelerator] | None = None) -> Accelerator:
    """A catalog id or a listed alias, however spelled (gpu_spelling), or a path to a GPU YAML; anything else fails
    with the nearest name and the list."""
    known = catalog() if known is None else known
    if gpu_id in known:   # an id as the catalog writes it (every `base:` of the catalog's own entries): no spelling
        return known[gpu_id]   # map to build (the catalog's names each read differently: tests/test_hardware.py)
    names = {k: k for k in known} | _aliases(known)
    by_spelling = {gpu_spelling(k): v for k, v in names.items()}
    key = by_spelling.get(gpu_spelling(gpu_id))
    if key is not None:
        return known[key]
    if gpu_id.lower().endswith((".yaml", ".yml", ".json")) or Path(gpu_id).is_file():
        found = load_accelerators(gpu_id, known=known)
        if len(found) != 1:
            raise InputError(f"GPU file {gpu_id} holds {len(found)} accelerators; --gpu takes a file of one "
                             "(its keys at the top level)")
        return next(iter(found.values()))
    import difflib   # here: only a misspelled GPU needs it (not imported at start-up)

    close = difflib.get_close_matches(gpu_spelling(gpu_id), list(by_spelling), n=1, cutoff=0.6)
    hint = f" (did you mean {by_spelling[close[0]]!r}?)" if close else ""
    raise InputError(f"unknown GPU {gpu_id!r}{hint}; known: {', '.join(known)}, or a GPU YAML file "
                     "(keys as in planner/accelerators.yaml)")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """The machine a plan is for: the accelerator, its nodes and their links, and any calibration applied."""

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
    elementwise_efficiency: float | None = None
    """memory-bound kernels' achieved fraction of the datasheet's HBM bandwidth, timed on this machine
    (planner.calibration); None: planner.constants.ELEMENTWISE_BW_EFFICIENCY"""
    attention_efficiency: float | None = None
    """the fused attention core's rate as a fraction of the 16-bit peak, in the op list's FLOPs (the full s x s
    square, so a causal kernel that skips masked blocks may exceed 1), timed forward + backward on this machine
    (planner.calibration); None: the attention's batched GEMMs at the GEMM shape model's rate"""
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
    nvlink_domain: int | None = None
    """GPUs one NVLink fabric joins across nodes (GB200 NVL72: 72, 18 trays of 4), a whole number of nodes; groups
    inside it run at the NVLink bandwidth even across nodes. None: the node is the domain"""

    def __post_init__(self) -> None:
        if self.gpus_per_node <= 0 or self.nodes <= 0:
            raise InputError(f"cluster {self.name!r}: gpus per node and nodes must be > 0")
        d = self.nvlink_domain
        if d is not None and (d < self.gpus_per_node or d % self.gpus_per_node):
            lo = max(self.gpus_per_node, d // self.gpus_per_node * self.gpus_per_node)
            raise InputError(f"NVLink domain {d} is not a whole number of {self.gpus_per_node}-GPU nodes; use {lo} "
                             f"(--nvlink-domain counts GPUs, e.g. 72 for GB200 NVL72's 18 trays of 4)")

    @property
    def domain_gpus(self) -> int:
        """GPUs whose collectives stay on NVLink: the NVLink domain (a GB200 NVL72 rack), else the node."""
        return self.nvlink_domain if self.nvlink_domain is not None else self.gpus_per_node

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def inter_node_bw_per_gpu(self) -> float:
        return self.inter_node_bw_bytes_per_s / self.gpus_per_node

    @property
    def context_bytes(self) -> float:
        return self.cuda_context_bytes if self.cuda_context_bytes is not None else self.gpu.cuda_context_bytes

    @property
    def host_memory_bytes(self) -> float | None:
        """Host memory of one of this cluster's nodes: the catalog's usual node's (`Accelerator.host_memory_bytes`)
        per GPU, times this node's GPUs; None when the catalog does not say."""
        acc = self.gpu
        if acc.host_memory_bytes is None:
            return None
        return acc.host_memory_bytes / acc.gpus_per_node * self.gpus_per_node

    def network_line(self) -> str:
        """The network assumed, in one line: rails x rate per node, per GPU, the intra-node link, the source."""
        total = self.inter_node_bw_bytes_per_s * 8 / 1e9
        rails = (f"{self.nics_per_node} x {self.nic_gbps:g} Gb/s NICs per node = {total:g} Gb/s"
                 if self.nics_per_node and self.nic_gbps else f"{total:g} Gb/s per node")
        kind = "measured bus bandwidth" if self.inter_node_bw_measured else rails
        intra = (f"{self.intra_node_bw_bytes_per_s / 1e9:g} GB/s per GPU "
                 f"{'measured' if self.intra_node_bw_measured else self.gpu.intra_node_link}")
        where = (f"inside an NVLink domain of {self.nvlink_domain} GPUs ({self.nvlink_domain // self.gpus_per_node} "
                 f"nodes of {self.gpus_per_node})" if self.nvlink_domain else "inside a node")
        return (f"network: {kind} ({self.inter_node_bw_per_gpu / 1e9:.1f} GB/s per GPU across nodes), "
                f"{intra} {where}; {self.network or 'default'}")

    def to_dict(self) -> dict:
        d = {"name": self.name, "gpu": self.gpu.id, "gpus_per_node": self.gpus_per_node, "nodes": self.nodes,
             "inter_node_gbps": round(self.inter_node_bw_bytes_per_s * 8 / 1e9, 3),
             "intra_node_gbps_per_gpu": round(self.intra_node_bw_bytes_per_s * 8 / 1e9, 3)}
        if self.nics_per_node and self.nic_gbps:
            d |= {"nics_per_node": self.nics_per_node, "nic_gbps": self.nic_gbps}
        if self.nvlink_domain:
            d["nvlink_domain"] = self.nvlink_domain
        return d


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterPreset:
    """A cluster people train on, with its real node and network figures."""

    gpu: str
    gpus_per_node: int
    nics_per_node: int
    nic_gbps: float
    source: str
    nvlink_domain: int | None = None
    """GPUs in one NVLink domain when it spans nodes (GB200 NVL72: 72); None: the node"""


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
    "dgx-b200": ClusterPreset(
        gpu="B200", gpus_per_node=8, nics_per_node=8, nic_gbps=400.0,
        source="NVIDIA DGX B200 user guide, Hardware Overview: 8 B200 (1,440 GB), 2 fifth-generation NVLink switches "
               "(14.4 TB/s aggregate = 1.8 TB/s per GPU), 4 OSFP ports for 8 single-port ConnectX-7 at up to "
               "400 Gb/s InfiniBand (one compute rail per GPU)"),
    "gb200-nvl72": ClusterPreset(
        gpu="GB200", gpus_per_node=4, nics_per_node=4, nic_gbps=400.0, nvlink_domain=72,
        source="NVIDIA DGX GB200 user guide, Hardware: racks of 72-GPU NVL domains, 18 compute trays of 2 Grace + "
               "4 Blackwell GPUs joined by 9 NVLink switch trays (NVLink 5, 1.8 TB/s per GPU bidirectional), each "
               "tray with 4 ConnectX-7 single-port 400G NICs for the cluster network (one per GPU); InfiniBand "
               "between racks"),
}
CLUSTER_PRESETS["selene"] = CLUSTER_PRESETS["dgx-a100-superpod"]
CLUSTER_PRESETS["dgx-gb200"] = CLUSTER_PRESETS["gb200-nvl72"]


def job_domain(usual: int | None, gpus_per_node: int, world: int) -> int | None:
    """The NVLink domain a job gets on machines whose domain is ``usual`` GPUs (None: the node), when the user does not
    say: the whole domain (in whole nodes) for a job that fits one; a job spanning several is placed in segments of a
    power-of-two number of nodes inside a domain, 16 trays = 64 GPUs on GB200 NVL72 (Slurm topology/block --segment;
    NVIDIA's "Slurm topology-aware job scheduling on GB200 NVL72" blog recommends segment size 16 for jobs of 128+
    GPUs), so that power-of-two groups never straddle two racks."""
    if usual is None:
        return None
    nodes = usual // gpus_per_node
    if world <= nodes * gpus_per_node:
        return nodes * gpus_per_node
    return 2 ** (nodes.bit_length() - 1) * gpus_per_node if nodes else None


def make_cluster(*, gpu: "str | Accelerator", gpus: int | None = None, gpus_per_node: int | None = None,
                 nodes: int | None = None, inter_node_gbps: float | None = None, intra_node_gbps: float | None = None,
                 name: str = "", nics_per_node: int | None = None, nic_gbps: float | None = None,
                 network: str = "", nvlink_domain: int | None = None) -> ClusterSpec:
    """A cluster from flags: ``--gpu A100-80GB --gpus 384 --gpus-per-node 8``.

    ``gpu`` is a catalog id, a GPU YAML path or an `Accelerator`; ``gpus_per_node`` defaults to the accelerator's
    usual node. Fewer GPUs than a node are one node of that many GPUs (a partial node: the same links inside it).
    The inter-node bandwidth per node is ``inter_node_gbps``, else ``nics_per_node`` x ``nic_gbps``, else one NIC
    per GPU at the accelerator's usual rate (its ``nic_gbps``). ``nvlink_domain`` (GPUs, whole nodes) defaults to
    `job_domain` of the accelerator's (GB200: 72; 64 for jobs beyond one rack); a domain no larger than the node is
    the node.
    """
    acc = gpu if isinstance(gpu, Accelerator) else get_accelerator(gpu)
    gpus_per_node = acc.gpus_per_node if gpus_per_node is None else gpus_per_node
    if gpus_per_node <= 0:
        raise InputError(f"--gpus-per-node must be > 0, got {gpus_per_node}")
    if nodes is None:
        if gpus is None or gpus <= 0:
            raise InputError(f"--gpus must be a positive integer, got {gpus}")
        if gpus < gpus_per_node:   # part of one node: plan the GPUs there are
            gpus_per_node = gpus
        if gpus % gpus_per_node:
            lo = gpus // gpus_per_node * gpus_per_node
            raise InputError(f"--gpus {gpus} is not a multiple of the node size {gpus_per_node}; use {lo} or "
                             f"{lo + gpus_per_node} (whole nodes), or set --gpus-per-node")
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
        rate = acc.nic_gbps
        inter, nics = rate * 1e9 / 8 * gpus_per_node, gpus_per_node
        network = network or (f"default for {acc.id}: one {rate:g} Gb/s NIC per GPU (a DGX-like node); give "
                              "--cluster PRESET/FILE or --inter-node-gbps for your cluster")
    intra = intra_node_gbps * 1e9 / 8 if intra_node_gbps else acc.intra_node_bw_bytes_per_s
    domain = nvlink_domain if nvlink_domain is not None else job_domain(acc.nvlink_domain, gpus_per_node,
                                                                        nodes * gpus_per_node)
    if domain is not None and domain <= gpus_per_node:   # the node (or the part of one planned) is the domain
        domain = None
    return ClusterSpec(name=name or f"{nodes}x{gpus_per_node} {acc.id}", gpu=acc, gpus_per_node=gpus_per_node,
                       nodes=nodes, inter_node_bw_bytes_per_s=inter, intra_node_bw_bytes_per_s=intra,
                       nics_per_node=nics, nic_gbps=rate, network=network, nvlink_domain=domain)


def preset_cluster(preset: str, *, gpus: int | None = None, nodes: int | None = None,
                   nvlink_domain: int | None = None) -> ClusterSpec:
    """A cluster preset (CLUSTER_PRESETS) at ``gpus`` / ``nodes`` (default: one node); ``nvlink_domain`` replaces the
    preset's (a job given part of each NVL72 rack: --nvlink-domain 64)."""
    p = CLUSTER_PRESETS[preset]
    if gpus is None and nodes is None:
        nodes = 1
    return make_cluster(gpu=p.gpu, gpus=gpus, nodes=nodes, gpus_per_node=p.gpus_per_node,
                        nics_per_node=p.nics_per_node, nic_gbps=p.nic_gbps, name=preset,
                        network=f"preset {preset}: {p.source}",
                        nvlink_domain=nvlink_domain if nvlink_domain is not None else job_domain(
                            p.nvlink_domain, p.gpus_per_node, gpus if gpus is not None else nodes * p.gpus_per_node))


def load_cluster(path: str, *, gpus: int | None = None, nodes: int | None = None,
                 nvlink_domain: int | None = None) -> ClusterSpec:
    """A cluster YAML (gpu, gpus_per_node, nodes, inter_node_gbps per node or nics_per_node x nic_gbps,
    intra_node_gbps per GPU, nvlink_domain in GPUs when NVLink spans nodes), or the name of a preset (CLUSTER_PRESETS:
    jean-zay-a100, dgx-h100-superpod, dgx-b200, gb200-nvl72, ...).
    ``gpu`` is a catalog id, a GPU YAML (a path beside the cluster file or as given), or the accelerator's
    description itself (a mapping of GPU YAML keys, ``base: ID`` to change a catalog entry)."""
    if path.strip().lower() in CLUSTER_PRESETS:
        return preset_cluster(path.strip().lower(), gpus=gpus, nodes=nodes, nvlink_domain=nvlink_domain)
    where = f"cluster YAML {path}"
    d = check(read_mapping(path, "cluster file"), CLUSTER, where)
    gpu = d["gpu"]
    if isinstance(gpu, str) and gpu.lower().endswith((".yaml", ".yml", ".json")) and not Path(gpu).is_absolute():
        beside = Path(path).parent / gpu
        gpu = str(beside) if beside.is_file() else gpu
    acc = accelerator_from(gpu, f"{where}: gpu", default_id=str(d.get("name") or Path(path).stem) + "-gpu")
    if nodes is None and gpus is None:
        nodes = d.get("nodes")
    return make_cluster(gpu=acc, gpus=gpus, gpus_per_node=d.get("gpus_per_node"), nodes=nodes,
                        inter_node_gbps=d.get("inter_node_gbps"), intra_node_gbps=d.get("intra_node_gbps"),
                        nics_per_node=d.get("nics_per_node"), nic_gbps=d.get("nic_gbps"), name=d.get("name", ""),
                        network=f"cluster file {path}" + (f": {d['source']}" if d.get("source") else ""),
                        nvlink_domain=nvlink_domain if nvlink_domain is not None else d.get("nvlink_domain"))
