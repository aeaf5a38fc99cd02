"""DeepSpeed's pipeline engine (2022) as a discrete-event simulation, against the planner's pipeline formula.

    python tests/bench/ds_pipe_schedule.py               # the shapes of issue 23, one line each, then the summary
    python tests/bench/ds_pipe_schedule.py --host-ms 1   # with 1 ms of host time per instruction

What is simulated (read from microsoft/DeepSpeed as BigScience ran it, 56c5223 = v0.6.x of 2022; the schedule is the
same from 2020 to 2023):
- runtime/pipe/schedule.py TrainSchedule: 2·(m + p - 1) steps per stage; stage s runs the forward of micro-batch
  t//2 - s//2 on the steps t of its own parity and the backward of micro-batch t//2 - p + 1 + s//2 on the others;
  a forward step is [RecvActivation(this micro-batch), SendGrad(the previous step's)], a backward step
  [SendActivation(the previous step's), RecvGrad(this micro-batch)], then LoadMicroBatch on the first and last
  stages, then ForwardPass / BackwardPass; ReduceTiedGrads, ReduceGrads, OptimizerStep after the last step.
- runtime/pipe/p2p.py: every send and receive is a blocking dist.send / dist.recv (async_op refused): NCCL runs it in
  the stage's stream, and it completes when both peers have posted it (a message of tens of MB, far over NCCL's
  buffers), after the transfer; the host does not wait for it (ProcessGroupNCCL's wait() joins streams only).
  The ops of a pair of stages meet in the order each side issues them (one NCCL communicator per pair): the
  simulation checks that the k-th op of one side is the complement of the k-th op of the other.
- runtime/pipe/engine.py: ForwardPass starts with ThroughputTimer.start(), a torch.cuda.synchronize() (the host
  waits for the stage's stream); with TP > 1 the activation travels partitioned (PartitionedTensor: a meta tensor and
  1/TP of the data, two sends) and is rebuilt by PartitionedTensor.from_meta (meta.tolist(), a device-to-host sync,
  then an all-gather) in the forward of every stage but the first and in RecvGrad of every stage but the last.
- per instruction, ``--host-ms`` of host time (Python dispatch); the host runs ahead of the stream but at the syncs,
  so a forward's share (after its synchronize: clone, from_meta, launch) sits on the stage's timeline.

Per-stage times come from the planner's own functions (planner.cost.step_context: the layer's forward + backward +
recompute with its TP all-reduces, the LM head and loss, the fp16 gradient accumulation over the stage's own
parameters, DeepSpeed's partition planner.pipeline_engine.deepspeed_stage_layers, the p2p messages on
planner.topology's pipeline link), so that the comparison isolates the schedule. The first stage's embedding backward
(the dense V/TP x h gradient it writes, torch's embedding_dense_backward) is added at HBM bandwidth; the planner has
none (under 0.1% of the step here; --no-embedding leaves it out). Three variants per shape:
- sim: the p2p and DS_MICROBATCH_OVERHEAD_S (TP > 1) as the engine runs them and the planner charges them: each
  message twice on a middle stage, once on the first and last, the overhead whole in every forward;
- ends twice: the end stages' messages charged twice (their second pass a fixed cost in the forward), as the planner
  did while its p2p was a fitted stand-in (gradients sent whole);
- at from_meta: the overhead half in the forward, half in RecvGrad, where the engine runs from_meta: RecvGrad's half
  sits between the two halves of an exchange, so the peer waits for it (lock-step).

Printed per shape: the planner's pipeline seconds (its per-micro-batch terms over gas + bubble slots), each
variant's makespan and (planner - simulation) as a share of the planner's step (DP and optimizer terms included).

What it found (issue 23; numbers from this script, /work/wt/notes/sched23.md has the table):
- equal stages, no transfers: exactly (m + p - 1)(F + B), 1F1B's; with transfers c each, a middle stage's slot
  carries 4 of them and the fill and drain 2(p - 1): (m + p - 1)(F + B + 4c) less about 2c(p + 2);
- unequal stages (the last holding the LM head and ceil(L/PP) layers, or the rest of L): (m - 1) slots of the
  slowest stage plus one pass of every stage, not (m + p - 1) slots of the slowest. The planner charged the latter
  until planner.pipeline_engine.pipeline_bubble_slots: 4.6% of the step slow on BLOOM-176B TP1 PP35 (70 layers,
  2 a stage, the LM head on the last), 2.2% at TP2 PP35, up to 2.4% on the tr11 shapes (72 layers on PP 12: 6 on
  every stage, the head on the last as well), 2.6% on seed 003's PP8 MBS8; now within 1% everywhere;
- the end stages carry each message once: 3.5% of the step on the tr11 shapes (mean; 6.4% at most), 1.5% on the
  BLOOM layouts (5.0% at TP2 PP35, where the last stage is the slowest); the planner charges them once since its p2p
  sends the gradients partitioned as DeepSpeed v0.5.4+ does (planner.framework), with DS_MICROBATCH_OVERHEAD_S and
  DS_DP_INTER_NODE_EFFICIENCY refitted;
- the fitted overhead at from_meta instead of in the forward: BigScience's own layout 1.8% of the step slower;
  TP > 1 at MBS 1 on deep pipelines up to 7.6% (BLOOM TP4 PP24), where the overhead is large beside a slot;
- host time per instruction (--host-ms): 1 ms moves BLOOM and tr11 by under 0.5% of the step, seed 003's pipelines by
  up to 1.4% (PP8 MBS1: 512 forwards a step, each after a synchronize).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from planner import pipeline_engine  # noqa: E402
from planner.constants import ELEMENTWISE_BW_EFFICIENCY  # noqa: E402
from planner.cost import CostParams, backward_share, estimate_time, grad_accumulation_s, \
    pp_microbatch_overhead_s, step_context, tp_comm_s  # noqa: E402
from planner.framework import padded_vocab  # noqa: E402
from planner.hardware import ClusterSpec, preset_cluster  # noqa: E402
from planner.model import ModelSpec, get_preset  # noqa: E402
from planner.rank import prepare  # noqa: E402
from planner.space import Candidate, TrainingSpec  # noqa: E402
from planner.topology import Topology, collective_time_s  # noqa: E402

FWD, BWD, LOAD = "fwd", "bwd", "load"
SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD = "send_act", "recv_act", "send_grad", "recv_grad"
COMPLEMENT = {SEND_ACT: RECV_ACT, RECV_ACT: SEND_ACT, SEND_GRAD: RECV_GRAD, RECV_GRAD: SEND_GRAD}
META_BYTES = 8 * 8   # PartitionedTensor's meta: a handful of int64


def train_schedule(m: int, p: int, s: int) -> list[tuple[str, int]]:
    """Stage ``s``'s instructions (kind, micro-batch) in TrainSchedule's order, the step structure flattened."""
    out: list[tuple[str, int]] = []
    prev = -1
    for t in range(2 * (m + p - 1)):
        forward = t % 2 == s % 2
        mb = t // 2 - s // 2 if forward else t // 2 - p + 1 + s // 2
        valid, prev_valid = 0 <= mb < m, 0 <= prev < m
        if forward:
            if valid and s > 0:
                out.append((RECV_ACT, mb))
            if prev_valid and s > 0:
                out.append((SEND_GRAD, prev))
        else:
            if prev_valid and s < p - 1:
                out.append((SEND_ACT, prev))
            if valid and s < p - 1:
                out.append((RECV_GRAD, mb))
        if forward and valid and s in (0, p - 1):
            out.append((LOAD, mb))
        if valid:
            out.append((FWD if forward else BWD, mb))
        prev = mb
    return out


@dataclass(frozen=True)
class Stage:
    """One stage's seconds per micro-batch."""

    fwd: float
    bwd: float
    meta_fwd: float = 0.0
    """from_meta + all-gather in the forward (TP > 1, not the first stage)"""
    meta_recv_grad: float = 0.0
    """from_meta + all-gather in RecvGrad (TP > 1, not the last stage)"""


@dataclass(frozen=True)
class Pipe:
    stages: tuple[Stage, ...]
    act_s: float
    """one activation's transfer (all its messages)"""
    grad_s: float
    host_s: float = 0.0
    """host time per instruction"""


@dataclass(frozen=True)
class SimResult:
    makespan: float
    first_backward_end: float
    """when the first stage finishes micro-batch 0's backward (the fill: p forwards down and p backwards up)"""
    busy: tuple[float, ...]
    """per stage: seconds its stream computes (fwd, bwd, from_meta)"""


def simulate(pipe: Pipe, m: int) -> SimResult:
    """The makespan of one step's TrainSchedule over ``pipe`` (every stage starts at 0 with an idle stream)."""
    p = len(pipe.stages)
    prog = [train_schedule(m, p, s) for s in range(p)]
    ptr = [0] * p
    gpu = [0.0] * p   # the stage's stream: when its queued work ends
    host = [0.0] * p  # the stage's host thread
    busy = [0.0] * p
    posted: dict[tuple[int, int], list[tuple[str, float]]] = {}   # (stage, peer) -> ops posted, in order
    waiting = [False] * p
    first_bwd = 0.0

    def pair_ops(s: int, peer: int) -> list[tuple[str, float]]:
        return posted.setdefault((s, peer), [])

    def step(s: int) -> bool:
        """Run stage s until it blocks on a p2p op its peer has not posted; True if it moved."""
        nonlocal first_bwd
        moved = False
        st = pipe.stages[s]
        while ptr[s] < len(prog[s]):
            kind, mb = prog[s][ptr[s]]
            if kind in COMPLEMENT:
                peer = s - 1 if kind in (RECV_ACT, SEND_GRAD) else s + 1
                mine = pair_ops(s, peer)
                if not waiting[s]:
                    host[s] += pipe.host_s
                    if kind == RECV_GRAD and st.meta_recv_grad:   # from_meta: meta.tolist() syncs the host
                        host[s] = max(host[s], gpu[s])
                        gpu[s] = host[s] + st.meta_recv_grad
                        busy[s] += st.meta_recv_grad
                    mine.append((kind, max(gpu[s], host[s])))
                    waiting[s] = True
                    moved = True
                k = len(mine) - 1
                theirs = pair_ops(peer, s)
                if len(theirs) <= k:
                    return moved   # blocked: the peer has not reached its side of this exchange
                other, at = theirs[k]
                assert other == COMPLEMENT[kind], f"stages {s},{peer}: op {k} is {kind} vs {other}: NCCL would hang"
                end = max(mine[k][1], at) + (pipe.act_s if kind in (SEND_ACT, RECV_ACT) else pipe.grad_s)
                for x in (s, peer):
                    gpu[x] = end
                    waiting[x] = False
                    ptr[x] += 1
                continue
            if kind == FWD:   # ThroughputTimer.start(): torch.cuda.synchronize(), then the host prepares and launches
                host[s] = max(host[s], gpu[s]) + pipe.host_s
                work = st.meta_fwd + st.fwd
                gpu[s] = host[s] + work
            elif kind == BWD:
                host[s] += pipe.host_s
                work = st.bwd
                gpu[s] = max(gpu[s], host[s]) + work
                if s == 0 and mb == 0:
                    first_bwd = gpu[s]
            else:
                host[s] += pipe.host_s
                work = 0.0
            busy[s] += work
            ptr[s] += 1
            moved = True
        return moved

    while any(ptr[s] < len(prog[s]) for s in range(p)):
        if not any([step(s) for s in range(p)]):
            raise RuntimeError("deadlock: every stage waits on a peer")
    return SimResult(makespan=max(gpu), first_backward_end=first_bwd, busy=tuple(busy))


# -- per-stage times from the planner ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    name: str
    model: ModelSpec
    cand: Candidate
    cluster: ClusterSpec
    training: TrainingSpec


@dataclass(frozen=True)
class Comparison:
    case: Case
    planner_pipe_s: float
    """the planner's per-micro-batch terms times (m + p - 1): what the simulation replaces"""
    planner_bubble_s: float
    planner_step_s: float
    sim: SimResult
    pipe: Pipe
    layers: tuple[int, ...]

    @property
    def sim_step_s(self) -> float:
        return self.planner_step_s - self.planner_pipe_s + self.sim.makespan

    @property
    def delta(self) -> float:
        """(planner - simulation) / planner's step: how far the planner's step is off the schedule's"""
        return (self.planner_pipe_s - self.sim.makespan) / self.planner_step_s


def stage_layers(layers: int, pp: int) -> tuple[int, ...]:
    split = pipeline_engine.deepspeed_stage_layers(layers, pp)
    return tuple([split.full] * (pp - 1 - split.empty) + [split.last] + [0] * split.empty)


def pipe_of(case: Case, host_s: float = 0.0, embedding: bool = True, overhead_at: str = "forward",
            end_p2p_twice: bool = False) -> tuple[Pipe, tuple[int, ...]]:
    """The stages of ``case`` with the planner's per-stage times (module docstring)."""
    model, cand, cluster, training = case.model, case.cand, case.cluster, case.training
    topo = Topology(cluster)
    ctx = step_context(model, cand, cluster, training, topo)
    r = ctx.rc.layers
    tp_layer = tp_comm_s(ctx) / ctx.stage_layers
    bwd_share = backward_share(ctx)
    tp_bwd_share = (2 + 2 * r) / (4 + 2 * r)   # 2 all-reduces forward, 2 backward, 2 per recomputed forward
    layers = stage_layers(model.layers, cand.pp)
    bw = cluster.gpu.memory_bw_bytes_per_s * ELEMENTWISE_BW_EFFICIENCY
    overhead = pp_microbatch_overhead_s(ctx)
    word = padded_vocab(model.vocab, cand.tp, ctx.fw) // cand.tp * model.hidden
    act = ctx.tokens * model.hidden * ctx.half
    link = topo.pp_link(cand.tp, cand.dp * cand.cp, cand.pp)

    def send(nbytes: float) -> float:
        return collective_time_s(link, kind="send", message_bytes=nbytes, group=2)

    act_s = send(act / cand.tp) + (send(META_BYTES) if cand.tp > 1 else 0.0) if ctx.fw.p2p_activation_split \
        else send(act)
    grad_s = send(act / cand.tp) if ctx.fw.p2p_grad_split else send(act)
    # ends twice: the end stages' messages charged twice (the schedule's one pass, and a second as a fixed cost in the
    # forward), as the planner did before pipeline_engine.p2p_serialization charged them once
    second_pass = act_s + grad_s if end_p2p_twice and cand.pp > 2 else 0.0
    stages = []
    for s, n in enumerate(layers):
        first, last = s == 0, s == cand.pp - 1
        params = n * model.params_per_layer / cand.tp + (word if first or last else 0)
        acc = grad_accumulation_s(replace(ctx, params_gpu=params))
        fwd = n * (ctx.layer_s * (1 - bwd_share) + tp_layer * (1 - tp_bwd_share))
        bwd = n * (ctx.layer_s * bwd_share + tp_layer * tp_bwd_share) + acc
        if last:
            fwd, bwd = fwd + ctx.head_s / 3, bwd + 2 * ctx.head_s / 3   # GEMMs and loss: backward = 2x forward
        if first and embedding:
            bwd += word * ctx.half / bw   # embedding_dense_backward writes the whole V/TP x h gradient
        if first or last:
            fwd += second_pass
        if overhead_at == "forward":   # the whole per-micro-batch cost in every forward: no exchange waits on it
            stages.append(Stage(fwd=fwd, bwd=bwd, meta_fwd=overhead))
        else:
            stages.append(Stage(fwd=fwd, bwd=bwd, meta_fwd=0.0 if first else overhead / 2,
                                meta_recv_grad=0.0 if last else overhead / 2))
    return Pipe(stages=tuple(stages), act_s=act_s, grad_s=grad_s, host_s=host_s), layers


def compare(case: Case, host_s: float = 0.0, embedding: bool = True, overhead_at: str = "forward",
            end_p2p_twice: bool = False) -> Comparison:
    time = estimate_time(case.model, case.cand, case.cluster, case.training, Topology(case.cluster))
    per_mb, bubble, _ = time.terms.groups(CostParams())
    pipe, layers = pipe_of(case, host_s, embedding, overhead_at, end_p2p_twice)
    sim = simulate(pipe, case.cand.gas)
    return Comparison(case=case, planner_pipe_s=sum(per_mb.values()) + bubble, planner_bubble_s=bubble,
                      planner_step_s=time.step_time_s, sim=sim, pipe=pipe, layers=layers)


# -- the shapes of issue 23 --------------------------------------------------------------------------------------
def bloom_cases() -> list[Case]:
    model = prepare(get_preset("176B"), TrainingSpec(global_batch=2048, seq_len=2048))
    training = TrainingSpec(global_batch=2048, seq_len=2048, framework="megatron-deepspeed", flash_attention=False)
    cluster = preset_cluster("jean-zay-a100", gpus=384)
    out = [Case("BLOOM-176B published", model, Candidate(tp=4, pp=12, dp=8, mbs=2, gas=128, recompute="full",
                                                         zero=0), cluster, training)]
    for tp, pp, mbs in ((1, 24, 1), (1, 35, 1), (2, 24, 1), (2, 35, 1), (2, 24, 2), (4, 24, 1), (8, 6, 1)):
        gpus = 384
        dp = gpus // (tp * pp)
        if dp < 1:
            continue
        gas = 2048 // (mbs * dp)
        out.append(Case(f"BLOOM-176B TP{tp} PP{pp}", model,
                        Candidate(tp=tp, pp=pp, dp=dp, mbs=mbs, gas=gas, recompute="full", zero=0),
                        cluster, replace(training, global_batch=gas * mbs * dp)))
    return out


def tr11_cases() -> list[Case]:
    from published import dev_cases
    out, seen = [], set()
    for c in dev_cases():
        if not c.table.startswith("bloom tr11") or c.cand.pp == 1 or c.caveat is not None:
            continue
        key = (c.model.hidden, c.model.layers, c.model.heads, c.cand)
        if key in seen:
            continue
        seen.add(key)
        m = c.model
        out.append(Case(f"tr11 h{m.hidden} L{m.layers} a{m.heads}", prepare(c.model, c.training), c.cand,
                        preset_cluster("jean-zay-a100", gpus=c.cand.world), c.training))
    return out


def seed003_cases() -> list[Case]:
    from published import seed003_dev_cases
    return [Case(f"1.3B seed 003 {c.table[9:]}", prepare(c.model, c.training), c.cand, c.cluster, c.training)
            for c in seed003_dev_cases() if c.cand.pp > 1]


def describe(c: Comparison, once: Comparison, meta: Comparison) -> str:
    k = c.case.cand
    return (f"{c.case.name:26} TP{k.tp} PP{k.pp:<2} MBS{k.mbs} GAS{k.gas:<4} layers {c.layers[0]}x{k.pp - 1}+"
            f"{c.layers[-1]:<2} planner {c.planner_pipe_s:7.2f} s  sim {c.sim.makespan:7.2f} s {100 * c.delta:+.2f}%  "
            f"ends twice {once.sim.makespan:7.2f} s {100 * once.delta:+.2f}%  "
            f"at from_meta {meta.sim.makespan:7.2f} s {100 * meta.delta:+.2f}%")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host-ms", type=float, default=0.0, help="host time per pipeline instruction, ms (default 0)")
    ap.add_argument("--no-embedding", action="store_true", help="leave out the first stage's embedding backward")
    args = ap.parse_args(argv)
    if args.host_ms < 0:
        print("ds_pipe_schedule: --host-ms must be >= 0; give the host time per instruction in ms", file=sys.stderr)
        return 2
    groups = {"BLOOM-176B (jean-zay-a100)": bloom_cases(), "tr11 dev shapes": tr11_cases(),
              "seed 003 1.3B pipelines": seed003_cases()}
    print("pipeline seconds of one step: the planner's, the simulation's and (planner - simulation) / the planner's "
          "step (+: the planner is slower).\n"
          "  sim: p2p and DS_MICROBATCH_OVERHEAD_S as the engine runs them and the planner charges them (each message "
          "twice on a middle stage, once on the end stages, the overhead whole in every forward);\n"
          "  ends twice: the end stages' messages charged twice, as the planner did before;\n"
          "  at from_meta: the overhead half in the forward, half in RecvGrad, where the engine rebuilds "
          "partitioned tensors (in the middle of an exchange)")
    for name, cases in groups.items():
        print(f"\n{name}")
        rows = []
        for case in cases:
            opts = (args.host_ms / 1000, not args.no_embedding)
            row = (compare(case, *opts), compare(case, *opts, end_p2p_twice=True),
                   compare(case, *opts, overhead_at="from_meta"))
            rows.append(row)
            print(describe(*row))
        for label, i in (("sim", 0), ("ends twice", 1), ("at from_meta", 2)):
            d = [100 * r[i].delta for r in rows]
            print(f"  {name}, planner - {label}: mean {sum(d) / len(d):+.2f}% of the step, "
                  f"range {min(d):+.2f}% .. {max(d):+.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
