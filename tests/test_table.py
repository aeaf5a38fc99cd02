"""planner.table.simple_table gives tabulate's "simple" text for the tables `plan` prints, and hands tabulate what it
does not render itself."""

from __future__ import annotations

import random

import pytest
from tabulate import tabulate

from planner import table
from planner.table import simple_table

WORDS = ["tp=4,pp=12,dp=8,mbs=2,gas=128,recompute=full,zero=1:", "predicted", "80.1", "GB", "on", "the", "first",
         "stage", ">", "76.0", "GB", "usable;", "a-hyphenated-word", "x" * 130, "ep=8", "-", "1e3", "nan", "inf", "7",
         "0.25", "block-3", "modules:layernorm+moe_act", "states>75%", "2~", "12%"]


def _cell(rng: random.Random, column: int):
    kind = (column + rng.randrange(4)) % 7
    if kind == 0:
        return rng.randrange(-5, 5000)
    if kind == 1:
        return rng.choice([rng.uniform(-1e4, 1e4), rng.random(), 1e-7 * rng.random(), 0.0, 1e21])
    if kind == 2:
        return rng.choice([None, ""])
    if kind == 3:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 30)))
    if kind == 4:
        return rng.choice(["7", "3.50", "1e3", " 12 ", "-4", "1_000", ".5", "nan"])
    if kind == 5:
        return f"{rng.randrange(1, 400)}-{rng.randrange(400, 900)}"
    return rng.choice(WORDS)


@pytest.mark.parametrize("seed", range(60))
def test_random_tables_match_tabulate(seed: int) -> None:
    rng = random.Random(seed)
    ncols, nrows = rng.randrange(1, 7), rng.randrange(1, 9)
    typed = [rng.random() < 0.5 for _ in range(ncols)]   # columns of one kind, or mixed
    rows = [[_cell(rng, c) if typed[c] else _cell(rng, rng.randrange(7)) for c in range(ncols)]
            for _ in range(nrows)]
    headers = [rng.choice(["#", "TP", "mem GB/GPU", "example", "count", "", "step s"]) for _ in range(ncols)]
    floatfmt = tuple(rng.choice([".0f", ".1f", ".3f", "", "g", ".2e"]) for _ in range(rng.randrange(0, ncols + 1)))
    widths = [rng.choice([None, None, 100, 20, 7]) for _ in range(rng.randrange(0, ncols + 1))] \
        if rng.random() < 0.5 else None
    assert simple_table(rows, headers, floatfmt or "g", widths) == tabulate(
        rows, headers=headers, floatfmt=floatfmt or "g", maxcolwidths=widths)


@pytest.mark.parametrize("seed", range(40))
def test_random_headerless_tables_match_tabulate(seed: int) -> None:
    """No headers (`plan --explain`'s memory and step-time tables): tabulate's rule above and below the rows."""
    rng = random.Random(1000 + seed)
    ncols, nrows = rng.randrange(1, 6), rng.randrange(1, 9)
    rows = [[_cell(rng, c if rng.random() < 0.5 else rng.randrange(7)) for c in range(ncols)] for _ in range(nrows)]
    floatfmt = rng.choice([".2f", ".3f", "g", ("", ".1f")])
    widths = [rng.choice([None, 100, 20, 7]) for _ in range(ncols)] if rng.random() < 0.3 else None
    assert simple_table(rows, [], floatfmt, widths) == tabulate(rows, floatfmt=floatfmt, maxcolwidths=widths)


def test_plan_tables_match_tabulate(monkeypatch) -> None:
    """`plan`'s own table, ruled-out reasons (wrapped at 100) and rampup schedule, rendered both ways."""
    from planner import cli

    def both(argv: list[str]) -> tuple[str, str]:
        import contextlib
        import io

        out = []
        for render in (simple_table, lambda rows, headers, floatfmt="g", maxcolwidths=None: tabulate(
                rows, headers=headers, floatfmt=floatfmt, maxcolwidths=maxcolwidths)):
            monkeypatch.setattr(cli, "simple_table", render)
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                assert cli.main(argv) == 0
            out.append(buf.getvalue().split("scored in", 1)[1].split(" s;", 1)[1])
        return out[0], out[1]

    for argv in (["--model", "176B", "--gpus", "384"], ["--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "H100",
                                                        "--framework", "megatron-lm", "--top", "30"]):
        mine, theirs = both(argv)
        assert "Ruled out" in mine and mine == theirs


@pytest.mark.parametrize("argv", [
    ["--model", "176B", "--gpus", "384", "--explain", "tp=4,pp=12,mbs=2,recompute=full,zero=1"],
    ["--model", "176B", "--gpus", "384", "--explain", "tp=3,pp=12,mbs=2,recompute=full,zero=1"],   # ruled out
    ["--model", "1B3", "--gpus", "8", "--gpu", "V100-16GB", "--precision", "fp16", "--explain",
     "tp=1,pp=1,mbs=4,recompute=none,zero=2"],   # fp16 DeepSpeed ZeRO: the pinned and released reserves
    ["--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "H100", "--framework", "megatron-lm", "--explain",
     "tp=2,pp=4,ep=8,mbs=1,recompute=full,zero=1,sp=1"],   # MoE: its mean layer's ops
])
def test_explain_tables_match_tabulate(monkeypatch, argv: list[str]) -> None:
    """`plan --explain`'s memory, step-time, terms and op tables, rendered both ways."""
    import contextlib
    import io

    from planner import cli

    out = []
    for render in (simple_table, lambda rows, headers=(), floatfmt="g", maxcolwidths=None: tabulate(
            rows, headers=headers, floatfmt=floatfmt, maxcolwidths=maxcolwidths)):
        monkeypatch.setattr(cli, "simple_table", render)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert cli.main(argv) == 0
        out.append(buf.getvalue())
    assert "\n---" in out[0] and out[0] == out[1]


def test_what_it_does_not_render_goes_to_tabulate(monkeypatch) -> None:
    rows = [["µs", 1], [True, 2], ["1,024", 3], ["tab\there", 4]]
    for row in rows:
        assert simple_table([row], ["a", "b"]) == tabulate([row], headers=["a", "b"])
    with pytest.raises(table._Unsupported):
        table._kind(True)


LINE_WORDS = ["ZeRO-1", "ZeRO-0", "--emit-flavor", "megatron-deepspeed", "a--b", "x-", "-y", "_-a", "a-_", "1-2",
              "ab-c", "a-b-c", "well-known", "tp=4,pp=12,dp=8:", "memory", "GB", "(seed", "004)", "a", "xyzzy" * 3,
              "re-run", "co-op", "e-mail", "A-B", "9-x", "x-9", "---", "-", "--", "ab--cd", "MBS*DP", "1920", "!="]


def test_the_word_wrap_is_textwraps_where_it_answers() -> None:
    """`_word_lines` (no textwrap import) gives what textwrap's wrapper gives, or hands the line to it: random lines of
    hyphenated, em-dashed and plain words at many widths, and it answers most of them itself."""
    rng = random.Random(29)
    answered = 0
    for _ in range(4000):
        line = " ".join(rng.choice(LINE_WORDS) for _ in range(rng.randrange(1, 25)))
        width = rng.randrange(1, 60)
        lines = table._word_lines(line, width)
        if lines is not None:
            answered += 1
            assert lines == table._wrapper(width).wrap(line), (line, width)
    assert answered > 1000
    for line in (" lead", "trail ", "two  spaces", "tab\there", "µs wide"):   # not single-spaced printable ASCII
        assert table._word_lines(line, 40) is None
