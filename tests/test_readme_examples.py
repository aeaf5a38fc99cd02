"""README.md's example outputs are what `plan` prints now (tests/bench/readme_examples.py; the tune replay and the
validation scripts' blocks are checked by `python3 tests/bench/readme_examples.py --check`, not here).

When this fails after a planner change: `python3 tests/bench/readme_examples.py --write`, then read the diff."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))
import readme_examples as rx  # noqa: E402

FAST = rx.selected(None, fast=True)


def test_every_example_has_one_block_and_every_block_an_example():
    have = rx.blocks(rx.README.read_text())
    assert sorted(have) == sorted(e.name for e in rx.EXAMPLES)


@pytest.mark.parametrize("example", FAST, ids=[e.name for e in FAST])
def test_plan_example_is_current(example):
    fresh = {example.name: rx.render(example)}
    assert rx.stale(rx.README.read_text(), fresh) == [], (
        f"README block {example.name!r} differs from what `{' '.join(example.steps[0].argv)}` prints now: "
        "run python3 tests/bench/readme_examples.py --write")


README = """intro
<!-- example: a -->
```
$ plan x
8208 candidates scored in 0.14 s; 43 fit
row 1
```
<!-- /example -->
middle
<!-- example: b -->
```
old
```
<!-- /example -->
end
"""


def test_stale_names_a_changed_block_and_ignores_timings():
    fresh = {"a": "$ plan x\n8208 candidates scored in 1.93 s; 43 fit\nrow 1\n", "b": "new\n"}
    assert rx.stale(README, fresh) == ["b"]
    fresh["a"] = fresh["a"].replace("row 1", "row 2")
    assert rx.stale(README, fresh) == ["a", "b"]


def test_replace_rewrites_only_stale_blocks_and_keeps_the_rest():
    fresh = {"a": "$ plan x\n8208 candidates scored in 1.93 s; 43 fit\nrow 1\n", "b": "new\nlines\n"}
    out = rx.replace(README, fresh)
    assert "scored in 0.14 s" in out                      # a matched but for its timing: left alone
    assert "```\nnew\nlines\n```\n<!-- /example -->\nend\n" in out
    assert out.startswith("intro\n") and "middle\n" in out
    assert rx.stale(out, fresh) == []


def test_a_missing_block_is_an_error():
    with pytest.raises(ValueError, match="no block for c"):
        rx.stale(README, {"c": "x\n"})


def test_cut_marks_what_it_leaves_out():
    step = rx.Step(("plan",), start="^b", stop="^d")
    assert rx._cut("a\nb\nc\nd\ne\n", step) == ["...", "b", "c", "..."]
    assert rx._cut("a\nb\n", rx.Step(("plan",))) == ["a", "b"]
    with pytest.raises(RuntimeError, match="no output line matches"):
        rx._cut("a\n", rx.Step(("plan",), start="^z"))


def test_prose_figures_agree_with_the_blocks_they_quote():
    """Figures the prose quotes from a generated block (tokens/s per GPU against the published figure, a rank, a
    table's spread) are the block's: a block regenerated after a planner change fails the sentence that quotes it
    (issue 32.6: the prose said 2.39x where the table said 2.38). Blocks are current by the tests above."""
    assert rx.wrong_claims(rx.README.read_text()) == []


def test_a_moved_figure_is_named():
    readme = rx.README.read_text()
    have = rx.blocks(readme)["megatron-overlap-explain"]
    tokens = next(line for line in have.splitlines() if line.endswith(" tokens/s"))
    moved = readme.replace(tokens, tokens.rsplit(", ", 1)[0] + ", 99,999 tokens/s")
    wrong = rx.wrong_claims(moved)
    assert len(wrong) == 1 and wrong[0].startswith("megatron-overlap-explain: the prose says") and "99,999" in wrong[0]
    assert rx.wrong_claims(readme.replace("it comes 29th", "it comes first")) == [
        "qwen3-moe-top3: the prose says first where the block makes 29th"]
    assert any("0 times" in w for w in rx.wrong_claims(readme.replace("the measured 128;", "the measured 128:")))
