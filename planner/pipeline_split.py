"""How Megatron-LM splits transformer layers over pipeline stages (one home for the split).

Source: NVIDIA/Megatron-LM d98e8a64, megatron/core/transformer/transformer_config.py ``__post_init__``
("Uneven PP": first and last stage sizes set independently, each a multiple of VPP, the rest divided equally over
the middle stages, each a multiple of VPP; ``account_for_embedding/loss_in_pipeline_split``: the embedding and the
loss count as one layer each, then layers + 2 divide by PP and each rank's share by VPP) and
megatron/training/arguments.py (``--decoder-first/last-pipeline-num-layers`` and the account-for flags exclude
each other). Llama 3 405B: 126 + 2 = 128 = 16 x 8 runs PP 16 with interleaving (Llama 3 paper, Sec. 3.3.2).

A split no flag gives, or a model with multi-token-prediction (MTP) layers, runs with Megatron-LM's
``--pipeline-model-parallel-layout`` (megatron/core/transformer/pipeline_parallel_layer_layout.py): one string of
PP x VPP model chunks in layer order (chunk i on PP rank i % PP, virtual stage i // PP), ``|`` between chunks,
``E`` embedding, ``t`` a decoder layer, ``m`` an MTP layer, ``L`` the loss, ``x*n`` and ``(...)*n`` repeats, commas
cosmetic; it sets VPP itself. The layout plantune writes is Megatron-Bridge's DeepSeek-V3 recipe rule
(src/megatron/bridge/recipes/deepseek/deepseek_v3.py ``set_deepseek_v3_pipeline_model_parallel_layout`` and
scripts/performance/configs/deepseek/deepseek_workload_base_configs.py), generalised: every chunk holds
s = ceil((layers + MTP) / chunks) decoder layers but the last, which holds the MTP layers and the loss in place of
up to s of the n*s - layers spare slots, and the first, which gives up the rest. It gives NVIDIA's published
DeepSeek-V3 layouts: PP4 x VPP4, PP8 x VPP2 and PP16 ``Et*4|(t*4|)*14tmL``, PP8 x VPP4 ``Et|(tt|)*30mL``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class StageSplit:
    """Transformer layers on the first, each middle and the last pipeline rank (all its VPP chunks together), and
    the Megatron-LM flags that give this split (``first_last``: --decoder-first/last-pipeline-num-layers)."""

    first: int
    middle: int          # 0 when PP <= 2 (no middle stage)
    last: int
    first_last: bool = False
    account_embedding: bool = False
    account_loss: bool = False
    layout: str = ""
    """Megatron-LM's --pipeline-model-parallel-layout when the split needs it (then no other split flag, and the
    layout sets VPP); the MTP layers and the loss sit on the last rank, the embedding on the first"""

    @property
    def busiest(self) -> int:
        return max(self.first, self.middle, self.last)

    def as_tuple(self) -> tuple[int, int, int]:
        return self.first, self.middle, self.last


def _candidates(layers: int, pp: int, vpp: int):
    n = pp * vpp
    if layers % n == 0:                                   # even split, no flag
        k = layers // pp
        yield StageSplit(k, k if pp > 2 else 0, k)
    if pp == 1:
        return
    # account-for flags: embedding / loss count as one layer each (transformer_config.py, both with and without VPP)
    for emb, loss in ((True, True), (True, False), (False, True)):
        total = layers + emb + loss
        k = total // pp
        # Megatron builds k/VPP - 1 layers in the chunk that holds the embedding (loss) and accepts 0
        # (transformer_block.get_num_layers_to_build: 'assert num_layers_to_build >= 0'): Llama 3 405B's 126 + 2 =
        # 16 x 8 x 1 runs PP 16 x VPP 8 with an embedding-only and a loss-only chunk (Llama 3 paper Sec. 3.3.2,
        # Table 4); the torch-native probe has its own rule (equal stages, rules.py)
        if total % n == 0 and k // vpp >= 1:
            yield StageSplit(k - emb, k if pp > 2 else 0, k - loss, account_embedding=emb, account_loss=loss)
    # --decoder-first/last-pipeline-num-layers: independent first and last sizes (multiples of VPP), the rest equal
    # over the PP-2 middle stages (multiples of VPP); edges kept at most a middle stage (they also hold embedding/loss)
    if pp == 2:
        for first in range(vpp, layers, vpp):
            if (layers - first) % vpp == 0:
                yield StageSplit(first, 0, layers - first, first_last=True)
        return
    for middle in range(vpp, layers // (pp - 2) + 1, vpp):
        rest = layers - (pp - 2) * middle
        for first in range(vpp, min(middle, rest - vpp) + 1, vpp):
            last = rest - first
            if last % vpp == 0 and 0 < last <= middle:
                yield StageSplit(first, middle, last, first_last=True)


def _run(kind: str, n: int) -> str:
    """``n`` layers of one kind as a layout writes them: t, tt, t*3 ... (Megatron-Bridge's spelling)."""
    return "" if n <= 0 else kind * n if n <= 2 else f"{kind}*{n}"


def format_layout(chunks: list[str]) -> str:
    """Chunks (each a string of E, t, m, L) as one layout string: runs of a kind as ``t*n``, equal chunks between the
    first and the last as ``(chunk|)*n``; the inverse of `parse_layout`."""
    def enc(chunk: str) -> str:
        return "".join(_run(k, len(g)) for k, g in ((m.group(0)[0], m.group(0)) for m in re.finditer(r"(.)\1*", chunk)))
    out = [enc(chunks[0]) + "|"] if len(chunks) > 1 else []
    inner, i = chunks[1:-1], 0
    while i < len(inner):
        j = i
        while j < len(inner) and inner[j] == inner[i]:
            j += 1
        out.append(f"({enc(inner[i])}|)*{j - i}" if j - i > 1 else enc(inner[i]) + "|")
        i = j
    out.append(enc(chunks[-1]))
    return "".join(out)


def parse_layout(text: str) -> list[str] | None:
    """A layout string -> its chunks (strings of E, t, m, L), or None when it is not one: Megatron-LM's grammar
    (pipeline_parallel_layer_layout.py parse_str_to_list: commas dropped, ``(...)*n`` then ``x*n`` unrolled, ``|``
    between chunks)."""
    s = text.replace(",", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), s)
    chunks = s.split("|")
    return chunks if all(set(c) <= set("EtmL") for c in chunks) else None


def layout_problem(chunks: list[str], pp: int, layers: int, mtp: int) -> str | None:
    """What Megatron-LM refuses in a layout (pipeline_parallel_layer_layout.py ``__init__`` and
    ``validate_layer_layout``), or None: chunks a multiple of PP; the embedding first and the loss last, once each;
    the decoder and MTP layer counts the model's; the MTP layers after every decoder layer, together in one chunk, the
    last virtual stage of a rank other than the first."""
    if len(chunks) % pp:
        return f"{len(chunks)} chunks are not a multiple of PP {pp}"
    flat = "".join(chunks)
    if not flat.startswith("E") or not flat.endswith("L") or flat.count("E") != 1 or flat.count("L") != 1:
        return "the embedding (E) must come first and the loss (L) last, once each"
    if flat.count("t") != layers or flat.count("m") != mtp:
        return (f"{flat.count('t')} decoder layers (t) and {flat.count('m')} MTP layers (m) for a model of {layers} "
                f"and {mtp}")
    if mtp:
        if "t" in flat[flat.index("m"):]:
            return "decoder layers (t) must all come before the MTP layers (m)"
        holding = [i for i, c in enumerate(chunks) if "m" in c]
        vpp = len(chunks) // pp
        if len(holding) != 1 or holding[0] // pp != vpp - 1 or (holding[0] % pp == 0 and pp > 1):
            return "the MTP layers (m) must share one chunk, the last virtual stage of a rank other than the first"
    return None


def layout_split(chunks: list[str], pp: int, layout: str) -> StageSplit:
    """The decoder layers on the first, the busiest middle and the last rank of a layout (chunk i on rank i % PP)."""
    per_rank = [sum(c.count("t") for c in chunks[r::pp]) for r in range(pp)]
    middle = max(per_rank[1:-1]) if pp > 2 else 0
    return StageSplit(per_rank[0], middle, per_rank[-1] if pp > 1 else per_rank[0], layout=layout)


def recipe_layout(layers: int, pp: int, vpp: int, mtp: int = 0) -> StageSplit | None:
    """Megatron-Bridge's DeepSeek-V3 layout rule, generalised (module docstring), or None when only the first and the
    last chunk cannot absorb the spare slots (the first keeps at least one decoder layer)."""
    n = pp * vpp
    if pp < 2 or layers < n:
        return None
    s = -(-(layers + mtp) // n)
    spare = n * s - layers
    last = max(0, s - spare)
    first = s - (spare - (s - last))
    if first < 1:
        return None
    chunks = ["E" + "t" * first] + ["t" * s] * (n - 2) + ["t" * last + "m" * mtp + "L"]
    if layout_problem(chunks, pp, layers, mtp):
        return None
    return layout_split(chunks, pp, format_layout(chunks))


def _rank(s: StageSplit) -> tuple:
    # the busiest rank first (it sets the step), then the larger edge (the first holds PP micro-batches in flight,
    # the last the LM head), then the last; on a tie: no flag, then first/last sizes, then account-for
    return s.busiest, max(s.first, s.last), s.last, s.first_last + 2 * (s.account_embedding or s.account_loss)


@lru_cache(maxsize=4096)   # pure in its ints; a plan asks it once per candidate
def megatron_lm_split(layers: int, pp: int, vpp: int = 1, mtp: int = 0) -> StageSplit | None:
    """The split Megatron-LM runs for ``layers`` (and ``mtp`` MTP layers) on PP x VPP, or None when neither a flag
    combination nor a layout allows it. With MTP layers (DeepSeek-V3) the layout of Megatron-Bridge's recipes, which
    sets one for every PP > 1, and puts the MTP layers and the loss on a last chunk lighter by as many layers; else
    the flags, and the layout where no flag gives a split."""
    if pp < 1 or vpp < 1 or layers < pp:
        return None
    if mtp and pp > 1:
        split = recipe_layout(layers, pp, vpp, mtp)
        if split is not None:
            return split
    flags = min(_candidates(layers, pp, vpp), key=_rank, default=None)
    return flags if flags is not None else recipe_layout(layers, pp, vpp, mtp)


@lru_cache(maxsize=1024)
def vpp_choices(layers: int, pp: int, mtp: int = 0) -> tuple[int, ...]:
    """Every VPP Megatron-LM can run ``layers`` with on PP ranks: 1, and each v > 1 with a split (arguments.py sets
    VPP from --num-virtual-stages-per-pipeline-rank or --num-layers-per-virtual-pipeline-stage and asks only that the
    layers divide; NeMo runs VP 5, 10, 12 and 20). Interleaving needs PP > 1."""
    if pp < 2:
        return (1,)
    return (1,) + tuple(v for v in range(2, layers // pp + 2) if megatron_lm_split(layers, pp, v, mtp) is not None)


__all__ = ["StageSplit", "format_layout", "layout_problem", "layout_split", "megatron_lm_split", "parse_layout",
           "recipe_layout", "vpp_choices"]
