"""Measure this machine for the planner: GEMM rate, collective bus bandwidth, CUDA context size.

    python -m probes.calibrate --nproc-per-node 2 --out calibration.yaml
    python -m probes.calibrate --nproc-per-node 8 --gpu H100-SXM --model llama2-7b --out cal.yaml
    plan ... --calibration calibration.yaml          # planner.calibration.apply_calibration reads it

`main` launches itself under torchrun (one process per device) and the workers measure:
- matmul: achieved TFLOP/s for the model's GEMM shapes (QKV, attention output, MLP in/out, LM
  head at ``--tokens`` tokens; square shapes without ``--model``), bf16 on GPU, fp32 on CPU;
  ``matmul_efficiency`` = FLOP-weighted achieved rate / peak, the peak from the catalog entry
  ``--gpu``, or -- on CPU, or without ``--gpu`` -- the best rate measured (said in ``notes``);
- all-reduce, all-gather, reduce-scatter over message sizes, bus bandwidth as nccl-tests
  (all-reduce algbw * 2(n-1)/n, all-gather / reduce-scatter algbw * (n-1)/n), in Gbit/s,
  inside a node (``intra_node_busbw_gbps``) and across nodes (``inter_node_busbw_gbps``);
- element-wise bandwidth: a large add (`ELEMENTWISE_ELEMENTS`, r2 r2 w2 in 16-bit) timed, bytes moved / seconds
  (``measurements.elementwise``; ``elementwise_efficiency`` = that / the catalog HBM bandwidth of ``--gpu``);
- the attention core: torch's scaled_dot_product_attention, causal, with the model's heads, KV heads and head_dim
  at ``--tokens`` (default its seq_len), one sequence, forward + backward (``measurements.attention``;
  ``attention_efficiency`` = the op list's attention FLOPs per second / the catalog peak of ``--gpu``:
  planner.calibration.attention_flops);
- the memory the CUDA context takes (``cuda_context_bytes``; 0 on CPU, with the RSS baseline);
- the host's launch cost: ``host_s_per_layer_forward``, forward + backward of `HOST_LAYERS` of the probes'
  transformer layer (`probes.gpt.Block`, the model's norm/GLU/position) at `HOST_SHAPE` (negligible FLOPs: the
  time is Python, autograd and kernel launches), divided by 3 per layer (a backward launches about twice a
  forward's kernels: the planner's host model, planner.cost.layer_compute_s).

`planner.calibration.apply_calibration` fits the planner's GEMM shape model to the timed shapes, scales its host
constants by the measured launch cost, and runs the op list's element-wise and attention ops at the timed rates.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import yaml

from probes.launch import probe_env, run_with_timeout, torchrun_argv

CPU_DIM_CAP = 2048
"""on CPU every GEMM dimension is capped here so that calibration takes seconds (say so in notes)"""
MIN_TIMED_S = {"cpu": 0.2, "cuda": 0.05}
"""time each measurement at least this long (seconds), after two warm-up runs"""
HOST_LAYERS = 8
"""layers in the host-launch measurement (one layer's launch time is the total / HOST_LAYERS / 3)"""
HOST_SHAPE = {"hidden": 64, "heads": 2, "ffn_hidden": 128, "seq_len": 8}
"""a layer whose kernels take microseconds on any device: what is timed is launching them"""
ELEMENTWISE_ELEMENTS = {"cpu": 2 ** 23, "cuda": 2 ** 28}
"""elements of each operand of the timed add: far beyond any cache (CPU 3 x 32 MiB fp32, GPU 3 x 512 MiB bf16)"""
ATTENTION_SHAPE = {"cpu": {"heads": 4, "kv_heads": 4, "head_dim": 64, "seq_len": 512},
                   "cuda": {"heads": 32, "kv_heads": 8, "head_dim": 128, "seq_len": 4096}}
"""the attention core timed without --model (a Llama-like layer); on CPU with --model, heads and the sequence are
capped at CPU_ATTENTION_CAP so that it takes seconds (said in notes)"""
CPU_ATTENTION_CAP = {"heads": 4, "seq_len": 512}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
MESSAGE_BYTES = {"cpu": [2 ** k for k in range(12, 25, 2)], "cuda": [2 ** k for k in range(20, 31, 2)]}
"""collective message sizes: 4 KiB..16 MiB on CPU/gloo, 1 MiB..1 GiB on GPU/NCCL"""


# -- measurements (in the workers) -----------------------------------------------------------------

def _gemm_shapes(model_name: str | None, tokens: int | None, device_type: str) -> list[tuple[str, int, int, int]]:
    """(name, m, n, k): C[m x n] = A[m x k] B[k x n] for one layer's GEMMs and the LM head."""
    if model_name is None:
        sizes = (512, 1024, 2048) if device_type == "cpu" else (2048, 4096, 8192)
        return [(f"square-{s}", s, s, s) for s in sizes]
    from planner.model import load_model

    m = load_model(model_name)
    t = tokens or m.seq_len
    shapes = [("qkv", t, m.hidden + 2 * m.kv_dim, m.hidden), ("attn-out", t, m.hidden, m.hidden),
              ("mlp-in", t, m.ffn_hidden * (2 if m.glu else 1), m.hidden), ("mlp-out", t, m.hidden, m.ffn_hidden),
              ("lm-head", t, m.vocab, m.hidden)]
    if device_type == "cpu":
        shapes = [(n, min(a, CPU_DIM_CAP), min(b, CPU_DIM_CAP), min(c, CPU_DIM_CAP)) for n, a, b, c in shapes]
    return shapes


def _time_op(fn, sync, device_type: str) -> float:
    """Seconds per call: two warm-up calls, then repeat until MIN_TIMED_S has passed."""
    fn()
    fn()
    sync()
    n, elapsed = 0, 0.0
    t0 = time.perf_counter()
    while elapsed < MIN_TIMED_S[device_type] or n < 3:
        fn()
        n += 1
        sync()
        elapsed = time.perf_counter() - t0
    return elapsed / n


def _time_collective(torch, dist, fn, sync, device, group) -> float:
    """Seconds per call of a collective; every rank runs the same count (the slowest rank's estimate)."""
    fn()
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    once = torch.tensor(time.perf_counter() - t0, dtype=torch.float64, device=device)
    dist.all_reduce(once, op=dist.ReduceOp.MAX, group=group)
    iters = int(min(50, max(3, MIN_TIMED_S[device.type] / max(once.item(), 1e-9))))
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters


def _measure_matmul(torch, device, dtype, shapes, report=None) -> list[dict]:
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    rows = []
    for name, m, n, k in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        seconds = _time_op(lambda: torch.mm(a, b), sync, device.type)
        rows.append({"name": name, "m": m, "n": n, "k": k, "dtype": str(dtype).removeprefix("torch."),
                     "seconds": seconds, "tflops": 2.0 * m * n * k / seconds / 1e12})
        if report is not None:
            report(len(rows), rows[-1])
        del a, b
    return rows


def _measure_elementwise(torch, device, dtype) -> dict:
    """A memory-bound kernel: c = a + b over ELEMENTWISE_ELEMENTS, reading two operands and writing one."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    n = ELEMENTWISE_ELEMENTS[device.type]
    a, b = torch.randn(n, device=device, dtype=dtype), torch.randn(n, device=device, dtype=dtype)
    c = torch.empty_like(a)
    seconds = _time_op(lambda: torch.add(a, b, out=c), sync, device.type)
    nbytes = 3 * n * a.element_size()
    return {"op": "add", "elements": n, "dtype": str(dtype).removeprefix("torch."), "bytes": nbytes,
            "seconds": seconds, "bytes_per_s": nbytes / seconds}


def _attention_shape(model_name: str | None, tokens: int | None, device_type: str) -> dict:
    if model_name is None:
        shape = dict(ATTENTION_SHAPE[device_type])
        if tokens:
            shape["seq_len"] = tokens
        return shape
    from planner.model import load_model

    m = load_model(model_name)
    shape = {"heads": m.heads, "kv_heads": m.kv_heads, "head_dim": m.head_dim, "seq_len": tokens or m.seq_len}
    if device_type == "cpu":
        group = max(1, m.heads // m.kv_heads)
        heads = min(shape["heads"], CPU_ATTENTION_CAP["heads"])
        shape.update(heads=heads, kv_heads=max(1, heads // group),
                     seq_len=min(shape["seq_len"], CPU_ATTENTION_CAP["seq_len"]))
    return shape


def _measure_attention(torch, device, dtype, shape: dict) -> dict:
    """scaled_dot_product_attention, causal, one sequence of ``shape``: forward, and forward + backward."""
    import torch.nn.functional as F

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    h, kv, d, s = shape["heads"], shape["kv_heads"], shape["head_dim"], shape["seq_len"]
    q = torch.randn(1, h, s, d, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(1, kv, s, d, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(1, kv, s, d, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(1, h, s, d, device=device, dtype=dtype)
    gqa = {"enable_gqa": True} if kv != h else {}

    def forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)

    def forward_backward():
        F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa).backward(grad)

    fwd = _time_op(forward, sync, device.type)
    fwd_bwd = _time_op(forward_backward, sync, device.type)
    return {"batch": 1, **shape, "causal": True, "dtype": str(dtype).removeprefix("torch."), "forward_s": fwd,
            "forward_backward_s": fwd_bwd}


def _measure_host(torch, device, dtype, model_name: str | None) -> dict:
    """Forward + backward seconds of HOST_LAYERS tiny probe layers, and one layer forward's host time (that / 3)."""
    from planner.model import ModelSpec, load_model
    from probes.gpt import Block

    like = load_model(model_name) if model_name else None
    kw = {"glu": like.glu, "position": like.position, "norm": like.norm, "bias": like.bias} if like else {
        "glu": True, "position": "rope", "norm": "rmsnorm", "bias": False}
    heads = HOST_SHAPE["heads"]
    m = ModelSpec(name="host-launch", layers=HOST_LAYERS, hidden=HOST_SHAPE["hidden"], heads=heads,
                  kv_heads=heads if like is None or like.kv_heads == like.heads else 1,
                  ffn_hidden=HOST_SHAPE["ffn_hidden"], vocab=128, seq_len=HOST_SHAPE["seq_len"], **kw)
    layers = torch.nn.Sequential(*(Block(m, recompute_core=False) for _ in range(HOST_LAYERS))).to(device)
    x = torch.randn(1, m.seq_len, m.hidden, device=device, requires_grad=True)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    def step():   # under autocast, as the probes run 16-bit precisions (probes.train)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            out = layers(x)
        out.float().sum().backward()

    seconds = _time_op(step, sync, device.type)
    return {"layers": HOST_LAYERS, **HOST_SHAPE, "glu": m.glu, "position": m.position, "norm": m.norm,
            "dtype": str(dtype).removeprefix("torch."), "forward_backward_s": seconds,
            "host_s_per_layer_forward": seconds / HOST_LAYERS / 3}


def _bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw: all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n."""
    return 2.0 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def _measure_collectives(torch, dist, device, group, label: str, report=None) -> list[dict]:
    n = dist.get_world_size(group)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    rows = []
    for size in MESSAGE_BYTES[device.type]:
        elems = size // 4                                   # fp32
        full = torch.ones(elems - elems % n, device=device)
        part = torch.empty(full.numel() // n, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        ops = {"all_reduce": lambda: dist.all_reduce(full, group=group),
               "all_gather": lambda: gather(full, part, group=group),
               "reduce_scatter": lambda: scatter(part, full, group=group)}
        for op, fn in ops.items():
            seconds = torch.tensor(_time_collective(torch, dist, fn, sync, device, group), dtype=torch.float64,
                                   device=device)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=group)   # the slowest rank's time
            nbytes = full.numel() * 4
            algbw = nbytes / seconds.item() * 8 / 1e9
            rows.append({"op": op, "group": label, "ranks": n, "bytes": nbytes, "seconds": seconds.item(),
                         "algbw_gbps": algbw, "busbw_gbps": algbw * _bus_factor(op, n)})
        if report is not None:
            report(size, rows[-3:])
    return rows


def _peak_busbw(rows: list[dict], label: str) -> float | None:
    values = [r["busbw_gbps"] for r in rows if r["op"] == "all_reduce" and r["group"] == label]
    return max(values) if values else None


def _worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available() and not args.cpu
    notes: list[str] = []
    rss_baseline = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    context_bytes = 0.0
    if cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)
        free, total = torch.cuda.mem_get_info(device)
        context_bytes = float(total - free - torch.cuda.memory_reserved(device))
        notes.append("cuda_context_bytes = device memory in use after the first allocation minus what the "
                     "caching allocator reserved (includes other processes on the same GPU, if any)")
    else:
        device = torch.device("cpu")
        notes.append("CPU: no CUDA context (cuda_context_bytes 0); rss_baseline_bytes is a process after import torch")
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")
    precision = args.precision or ("bf16" if cuda else "fp32")
    dtype = getattr(torch, DTYPES[precision])
    shapes = _gemm_shapes(args.model, args.tokens, device.type)
    if device.type == "cpu" and args.model:
        notes.append(f"CPU: GEMM dimensions capped at {CPU_DIM_CAP}")
    _say(args, rank, f"{world} process(es) on {device.type}; timing {len(shapes)} GEMM shapes")
    matmul = _measure_matmul(torch, device, dtype, shapes,
                             lambda i, row: _say(args, rank, f"GEMM {i}/{len(shapes)} {row['name']} "
                                                             f"{row['m']}x{row['n']}x{row['k']}: "
                                                             f"{row['tflops']:.3g} TFLOP/s"))
    elementwise = _measure_elementwise(torch, device, dtype)
    _say(args, rank, f"element-wise add: {elementwise['bytes_per_s'] / 1e9:.3g} GB/s")
    att_shape = _attention_shape(args.model, args.tokens, device.type)
    if device.type == "cpu" and args.model:
        notes.append(f"CPU: attention heads capped at {CPU_ATTENTION_CAP['heads']}, its sequence at "
                     f"{CPU_ATTENTION_CAP['seq_len']}")
    attention = _measure_attention(torch, device, dtype, att_shape)
    from planner.calibration import attention_flops

    att_flops = attention_flops(1, att_shape["heads"], att_shape["seq_len"], att_shape["head_dim"])
    attention["tflops_op_list"] = att_flops / attention["forward_backward_s"] / 1e12
    _say(args, rank, f"attention core {att_shape['heads']} heads x {att_shape['head_dim']}, sequence "
                     f"{att_shape['seq_len']}, causal, forward + backward: {attention['forward_backward_s'] * 1e3:.3g}"
                     f" ms ({attention['tflops_op_list']:.3g} TFLOP/s in the op list's full-square FLOPs)")
    host = _measure_host(torch, device, dtype, args.model)
    _say(args, rank, f"host launch: {host['host_s_per_layer_forward'] * 1e3:.3g} ms per layer forward "
                     f"({HOST_LAYERS} tiny layers forward + backward in {host['forward_backward_s'] * 1e3:.3g} ms)")
    weighted = sum(2.0 * r["m"] * r["n"] * r["k"] for r in matmul) / sum(r["seconds"] for r in matmul) / 1e12
    best = max(r["tflops"] for r in matmul)
    peak_tflops, peak_source = best, "best measured GEMM rate (no catalog peak)"
    catalog: dict = {}
    if cuda and args.gpu:
        from planner.hardware import get_accelerator

        acc = get_accelerator(args.gpu)
        peak_tflops = acc.peak_flops(precision) / 1e12
        peak_source = f"catalog peak {precision} of {args.gpu}"
        catalog = {"elementwise_efficiency": round(min(elementwise["bytes_per_s"] / acc.memory_bw_bytes_per_s, 1.0), 4),
                   "attention_efficiency": round(min(attention["tflops_op_list"] / peak_tflops, 4.0), 4)}
    elif cuda:
        notes.append("no --gpu given: matmul_efficiency is relative to the best measured GEMM, not the datasheet")
    else:
        notes.append("CPU: peak taken as the best measured large-GEMM rate, so matmul_efficiency is relative")

    collectives: list[dict] = []
    intra = inter = None

    def said(label):
        sizes = MESSAGE_BYTES[device.type]

        def line(size, rows):
            amount = f"{size / 2 ** 20:g} MiB" if size >= 2 ** 20 else f"{size / 2 ** 10:g} KiB"
            _say(args, rank, f"{label} collectives {sizes.index(size) + 1}/{len(sizes)} ({amount}): "
                             + ", ".join(f"{r['op']} {r['busbw_gbps']:.3g} Gbit/s" for r in rows))
        return line

    if world > 1:
        nnodes = world // local_world
        if nnodes > 1:
            node_group, _ = dist.new_subgroups(group_size=local_world)
            if local_world > 1:
                collectives += _measure_collectives(torch, dist, device, node_group, "intra_node", said("intra-node"))
            collectives += _measure_collectives(torch, dist, device, None, "inter_node", said("inter-node"))
            inter = _peak_busbw(collectives, "inter_node")
        else:
            collectives += _measure_collectives(torch, dist, device, None, "intra_node", said("intra-node"))
        intra = _peak_busbw(collectives, "intra_node")
    else:
        notes.append("one process: no collective measured")

    if rank == 0:
        doc: dict = {
            "device": (torch.cuda.get_device_name(device) if cuda else "cpu")
            + f" ({'nccl' if cuda else 'gloo'}), {world} processes, {world // local_world} node(s)",
            "matmul_efficiency": round(min(weighted / peak_tflops, 1.0), 4),
            "matmul_peak_tflops": peak_tflops,
            "matmul_peak_source": peak_source,
            "cuda_context_bytes": context_bytes,
            "host_s_per_layer_forward": host["host_s_per_layer_forward"],
            **catalog,
        }
        if intra is not None:
            doc["intra_node_busbw_gbps"] = round(intra, 3)
        if inter is not None:
            doc["inter_node_busbw_gbps"] = round(inter, 3)
        doc["notes"] = notes
        doc["measurements"] = {"matmul": matmul, "matmul_weighted_tflops": weighted, "elementwise": elementwise,
                               "attention": attention, "collectives": collectives,
                               "host_launch": host, "rss_baseline_bytes": rss_baseline, "torch": torch.__version__,
                               "units": "seconds per call; tflops = 1e12 FLOP/s; *_gbps = 1e9 bit/s"}
        Path(args.out).write_text(yaml.safe_dump(json.loads(json.dumps(doc)), sort_keys=False))
        print(f"wrote {args.out}: matmul_efficiency {doc['matmul_efficiency']}, element-wise "
              f"{elementwise['bytes_per_s'] / 1e9:.3g} GB/s, attention {attention['tflops_op_list']:.3g} TFLOP/s, "
              f"host launch "
              f"{host['host_s_per_layer_forward'] * 1e3:.3g} ms per layer forward, intra_node_busbw_gbps "
              f"{doc.get('intra_node_busbw_gbps', 'N/A')}", flush=True)
    if world > 1:
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# -- launcher (the command a person runs) -----------------------------------------------------------

def _say(args: argparse.Namespace, rank: int, text: str) -> None:
    """One progress line from rank 0 (on stderr, so that a log shows what calibration is doing)."""
    if rank == 0 and not args.quiet:
        print(f"calibrate: {text}", file=sys.stderr, flush=True)


def _parser(prog: str = "python -m probes.calibrate") -> argparse.ArgumentParser:
    from planner.cli import OneLineParser, number

    p = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=number(int), default=1,
                   help="processes (devices) per node")
    p.add_argument("--nnodes", type=number(int), default=1,
                   help="nodes (run this command on each, with --rdzv-endpoint)")
    p.add_argument("--node-rank", "--node_rank", type=number(int, allow_zero=True), default=None,
                   help="this node's rank (nnodes > 1)")
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", default=None, help="host:port of the rendezvous (nnodes > 1)")
    p.add_argument("--out", required=True, help="calibration YAML to write")
    p.add_argument("--gpu", default=None,
                   help="catalog id of the GPU or a GPU YAML (planner.hardware), for its datasheet peak")
    p.add_argument("--model", default=None, help="model preset or file whose GEMM shapes to time")
    p.add_argument("--tokens", type=number(int), default=None,
                   help="GEMM rows = tokens per micro-batch (default seq_len)")
    p.add_argument("--timeout-s", "--timeout_s", type=number(float), default=600.0,
                   help="stop the measurement after this many seconds (default 600)")
    p.add_argument("--precision", choices=tuple(DTYPES), default=None,
                   help="GEMM and layer dtype: the plan's --precision (default bf16 on a GPU, fp32 on the CPU)")
    p.add_argument("--cpu", action="store_true", help="measure the CPU even when a GPU is present")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None, *, prog: str = "python -m probes.calibrate") -> int:
    args = _parser(prog).parse_args(argv)
    if args.worker:
        return _worker(args)
    if args.nnodes > 1 and not args.rdzv_endpoint:
        print(f"{prog}: error: --nnodes > 1 needs --rdzv-endpoint HOST:PORT (and this command run on every node)",
              file=sys.stderr)
        return 2
    if args.model is not None:                  # a bad --model: one line here, not a traceback from every worker
        from planner.errors import PlantuneError
        from planner.model import load_model

        try:
            load_model(args.model)
        except PlantuneError as err:
            print(f"{prog}: error: --model {args.model}: {err}", file=sys.stderr)
            return 2
        if Path(args.model).is_file():         # the workers run in --out's folder: give them the file, not a name
            args.model = str(Path(args.model).resolve())
    if args.gpu is not None:
        from planner.errors import PlantuneError
        from planner.hardware import get_accelerator

        try:
            get_accelerator(args.gpu)
        except PlantuneError as err:
            print(f"{prog}: error: --gpu {args.gpu}: {err}", file=sys.stderr)
            return 2
    out = Path(args.out)
    if out.is_symlink() or out.is_dir():
        print(f"{prog}: error: --out {out} is a {'link' if out.is_symlink() else 'folder'}; give a file name",
              file=sys.stderr)
        return 2
    if out.exists() and not args.force:
        print(f"{prog}: error: --out {out} exists; give a new file name, or add --force to replace it", file=sys.stderr)
        return 2
    out = out.resolve()
    try:                                        # an unwritable --out: one line here, not a traceback from rank 0
        out.parent.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=out.parent, prefix=".calibrate-", delete=True)
        probe.close()
    except OSError as err:
        print(f"{prog}: error: --out {args.out}: cannot write there ({err.strerror or err}); give a file in a "
              "folder you can write", file=sys.stderr)
        return 2
    worker_args = ["--worker", "--out", str(out)]
    if args.quiet:
        worker_args.append("--quiet")
    for flag, value in (("--gpu", args.gpu), ("--model", args.model), ("--tokens", args.tokens),
                        ("--precision", args.precision)):
        if value is not None:
            worker_args += [flag, str(value)]
    if args.cpu:
        worker_args.append("--cpu")
    cmd = torchrun_argv(nproc=args.nproc_per_node, nnodes=args.nnodes, node_rank=args.node_rank,
                        rdzv_endpoint=args.rdzv_endpoint, rdzv_id="plantune-calibrate", module="probes.calibrate",
                        module_args=worker_args)
    if not args.quiet:
        print(f"calibrate: {args.nproc_per_node} process(es) per node x {args.nnodes} node(s), at most "
              f"{args.timeout_s:g} s; progress below", file=sys.stderr, flush=True)
    started = time.monotonic()
    returncode, timed_out, _ = run_with_timeout(cmd, env={**os.environ, **probe_env()}, timeout_s=args.timeout_s,
                                                workdir=out.parent)
    if not args.quiet and returncode == 0 and not timed_out:
        print(f"calibrate: done in {time.monotonic() - started:.0f} s: {out}", file=sys.stderr, flush=True)
    if timed_out:
        print(f"{prog}: error: calibration did not finish within {args.timeout_s:g} s; processes killed",
              file=sys.stderr)
        return 1
    if returncode != 0 or not out.is_file():
        print(f"{prog}: error: calibration failed (torchrun exit code {returncode}); see the output above",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
