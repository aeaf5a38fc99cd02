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
