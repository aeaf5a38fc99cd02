"""Mock data for a torchtitan 0.3.0 probe: random tokens through torchtitan's own dataloader, a tokenizer that is
only a vocabulary size. Imported by the probe's config module (probes.torchtitan) in torchtitan's workers, so a
probe needs no dataset and no tokenizer files, as Megatron-LM's ``--mock-data --tokenizer-type NullTokenizer``.

    cfg.tokenizer = MockTokenizer.Config(vocab_size=V)
    cfg.dataloader = MockDataLoader.Config(vocab_size=V)

The batches have the shape torchtitan's HuggingFaceTextDataset yields (hf_datasets/text_datasets.py):
``({"input": ids, "positions": 0..seq_len-1}, labels)``, labels the inputs shifted by one token. The classes are
torchtitan ``Configurable`` subclasses (config/configurable.py: a nested ``Config`` is wired to its owner), built by
the trainer like its own (``config.tokenizer.build(tokenizer_path=...)``, ``config.dataloader.build(dp_world_size=...,
dp_rank=..., tokenizer=..., seq_len=..., local_batch_size=..., snapshot_every_n_steps=...)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.tokenizer import BaseTokenizer


class MockTokenizer(BaseTokenizer):
    """A vocabulary size and nothing else: the mock data is already tokens."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        vocab_size: int = 0

    def __init__(self, config: Config, *, tokenizer_path: str | None = None) -> None:  # noqa: ARG002
        super().__init__()
        self.vocab_size = config.vocab_size
        self.eos_id = 0

    def encode(self, *args, **kwargs) -> list[int]:
        raise NotImplementedError("the mock tokenizer of a plantune probe encodes no text")

    def decode(self, *args, **kwargs) -> str:
        raise NotImplementedError("the mock tokenizer of a plantune probe decodes no tokens")

    def get_vocab_size(self) -> int:
        return self.vocab_size


class RandomTokens(IterableDataset):
    """Endless samples of ``seq_len`` uniformly random tokens, seeded by the data-parallel rank."""

    def __init__(self, *, vocab_size: int, seq_len: int, seed: int) -> None:
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        positions = torch.arange(self.seq_len, dtype=torch.long)
        while True:
            tokens = torch.randint(0, self.vocab_size, (self.seq_len + 1,), generator=g, dtype=torch.long)
            yield {"input": tokens[:-1], "positions": positions}, tokens[1:]

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: ARG002
        return None


class MockDataLoader(ParallelAwareDataloader):
    """torchtitan's data-parallel-aware dataloader over `RandomTokens`."""

    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        vocab_size: int = 0

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, tokenizer: BaseTokenizer | None = None,
                 seq_len: int, local_batch_size: int, snapshot_every_n_steps: int | None = None,
                 **kwargs) -> None:  # noqa: ARG002
        vocab = config.vocab_size or (tokenizer.get_vocab_size() if tokenizer is not None else 0)
        if vocab <= 0:
            raise ValueError("MockDataLoader needs vocab_size > 0")
        super().__init__(RandomTokens(vocab_size=vocab, seq_len=seq_len, seed=1234 + dp_rank), dp_rank=dp_rank,
                         dp_world_size=dp_world_size, batch_size=local_batch_size)


__all__ = ["MockDataLoader", "MockTokenizer", "RandomTokens"]
