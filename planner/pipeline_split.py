"""How Megatron-LM splits transformer layers over pipeline stages (one home for the split).

Source: NVIDIA/Megatron-LM d98e8a64, megatron/core/transformer/transformer_config.py ``__post_init__``
("Uneven PP": first and last stage sizes set independently, each a multiple of VPP, the rest divided equally over
the middle stages, each a multiple of VPP; ``account_for_embedding/loss_in_pipeline_split``: the embedding and the
loss count as one layer each, then layers + 2 divide by PP and each rank's share by VPP) and
megatron/training/arguments.py (``--decoder-first/last-pipeline-num-layers`` and the account-for flags exclude
each other). Llama 3 405B: 126 + 2 = 128 = 16 x 8 runs PP 16 with interleaving (Llama 3 paper, Sec. 3.3.2).
"""

from __future__ import annotations

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


def _rank(s: StageSplit) -> tuple:
    # the busiest rank first (it sets the step), then the larger edge (the first holds PP micro-batches in flight,
    # the last the LM head), then the last; on a tie: no flag, then first/last sizes, then account-for
    return s.busiest, max(s.first, s.last), s.last, s.first_last + 2 * (s.account_embedding or s.account_loss)


@lru_cache(maxsize=4096)   # pure in its ints; a plan asks it once per candidate
def megatron_lm_split(layers: int, pp: int, vpp: int = 1) -> StageSplit | None:
    """The split Megatron-LM runs for ``layers`` on PP x VPP, or None when no flag combination allows it."""
    if pp < 1 or vpp < 1 or layers < pp:
        return None
    return min(_candidates(layers, pp, vpp), key=_rank, default=None)


@lru_cache(maxsize=1024)
def vpp_choices(layers: int, pp: int) -> tuple[int, ...]:
    """Every VPP Megatron-LM can run ``layers`` with on PP ranks: 1, and each v > 1 with a split (arguments.py sets
    VPP from --num-virtual-stages-per-pipeline-rank or --num-layers-per-virtual-pipeline-stage and asks only that the
    layers divide; NeMo runs VP 5, 10, 12 and 20). Interleaving needs PP > 1."""
    if pp < 2:
        return (1,)
    return (1,) + tuple(v for v in range(2, layers // pp + 2) if megatron_lm_split(layers, pp, v) is not None)


__all__ = ["StageSplit", "megatron_lm_split", "vpp_choices"]
