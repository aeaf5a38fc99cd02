"""`plan`'s text tables in tabulate's "simple" format, without importing tabulate (its import, which looks its own
version up among the installed packages and loads wcwidth's tables, took longer than the plan of BLOOM-176B).

`simple_table` gives what ``tabulate(rows, headers=headers, floatfmt=..., maxcolwidths=...)`` gives for the cells a
plan prints (printable ASCII text, ints, floats, None), read off tabulate 0.10's documented rules: a column's type is
the most generic of its cells' (a string that parses as a number counts as one; "" and None as none), numbers are
right-aligned on their decimal point and text left-aligned, each column at least its header's width plus 2, a
header aligned as its column, two spaces between columns, trailing spaces stripped; a cell wrapped at its
``maxcolwidths`` entry (words kept whole, a longer word cut at the width) spreads its row over several lines. Any
other cell (non-ASCII or control characters, a bool, a number written with thousands separators) goes to tabulate
itself; tests/test_table.py holds the two to the same text.
"""

from __future__ import annotations

import math
from typing import Sequence

MIN_PADDING = 2
"""tabulate's MIN_PADDING: a column is at least its header's width plus this"""

_NONE, _INT, _FLOAT, _STR = 0, 2, 3, 5
"""tabulate's order of generality of a column's types (bool 1, bytes 4: never taken here)"""


class _Unsupported(Exception):
    """A cell `simple_table` does not render itself: tabulate renders the table."""


def _is_float_text(s: str) -> bool:
    """tabulate's _isnumber for a string: float() reads it, and it is no overflow to inf (inf and nan themselves
    are numbers)."""
    try:
        f = float(s)
    except ValueError:
        return False
    return not (math.isinf(f) or math.isnan(f)) or s.lower() in ("inf", "-inf", "nan")


def _is_int_text(s: str) -> bool:
    try:
        int(s)
    except ValueError:
        return False
    return True


def _kind(value: object) -> int:
    """tabulate's _type of a cell, as its generality."""
    if value is None:
        return _NONE
    t = type(value)
    if t is int:
        return _INT
    if t is float:
        return _FLOAT
    if t is not str:
        raise _Unsupported
    if not value:
        return _NONE
    if not (value.isascii() and value.isprintable()) or value in ("True", "False") \
            or ("," in value and _is_float_text(value.replace(",", ""))):
        raise _Unsupported
    if _is_int_text(value):
        return _INT
    return _FLOAT if _is_float_text(value) else _STR


def _is_number(value: object) -> bool:
    return type(value) in (int, float) or (type(value) is str and _is_float_text(value))


def _format(value: object, kind: int, floatfmt: str) -> str:
    if value is None or value == "":
        return ""
    if kind == _INT:
        return format(value, "")
    if kind == _FLOAT:
        return format(float(value), floatfmt)
    return f"{value}"


def _after_point(s: str) -> int:
    """Characters after the decimal point (or exponent) of a number, -1 for an integer or text."""
    if not _is_float_text(s) or _is_int_text(s):
        return -1
    pos = s.rfind(".")
    pos = s.lower().rfind("e") if pos < 0 else pos
    return len(s) - pos - 1 if pos >= 0 else -1


def _wrapper(width: int):
    import textwrap

    class Wrap(textwrap.TextWrapper):
        """textwrap's, but a word longer than the line is cut at the width, never at a hyphen (tabulate's)."""

        def _handle_long_word(self, reversed_chunks, cur_line, cur_len, width):
            space_left = 1 if width < 1 else width - cur_len
            if self.break_long_words and space_left > 0:
                chunk = reversed_chunks[-1]
                cur_line.append(chunk[:space_left])
                reversed_chunks[-1] = chunk[space_left:]
            elif not cur_line:
                cur_line.append(reversed_chunks.pop())
    return Wrap(width=width)


def _may_split(word: str) -> bool:
    """textwrap may cut the (ASCII) word into chunks: it cuts only after a hyphen followed by a letter (or ``_``;
    "ZeRO-1" stays whole) and around a run of two or more hyphens (its em-dash)."""
    return "--" in word or any(c == "-" and (n.isalpha() or n == "_") for c, n in zip(word, word[1:]))


def _word_lines(line: str, width: int) -> list[str] | None:
    """textwrap's lines (`_wrapper`) for a line of printable ASCII words one space apart, without textwrap (whose
    import compiles its word-splitting patterns: ~2 ms of `plan`'s start-up), or None where they could differ.

    textwrap cuts the line into chunks (words, the spaces between them, and the parts of a word after each hyphen)
    and fills each line with as many as fit, a line's edge spaces dropped. A word without a hyphen is one chunk, so
    filling word by word gives its lines, unless a word is longer than the line (cut: `_wrapper`) or a word that
    starts a new line may be cut (`_may_split`: textwrap may have ended the line before with part of it): None
    then."""
    if width < 1 or "  " in line or line != line.strip() or not (line.isascii() and line.isprintable()):
        return None
    words = line.split(" ")
    if any(len(w) > width for w in words):
        return None
    lines, current = [], words[0]
    for word in words[1:]:
        if len(current) + 1 + len(word) <= width:
            current += " " + word
        elif _may_split(word):
            return None
        else:
            lines.append(current)
            current = word
    lines.append(current)
    return lines


def _wrapped(rows: list[list], maxcolwidths: Sequence[int | None]) -> list[list]:
    """The cells of a column with a width, text wrapped to it (numbers left as they are)."""
    out = []
    wrappers: dict = {}   # width -> its wrapper, built once a table (`_wrapper` defines a class each call)

    def wrap(line: str, width: int) -> list[str]:
        lines = _word_lines(line, width)
        if lines is None:
            wrapper = wrappers.get(width)
            if wrapper is None:
                wrapper = wrappers[width] = _wrapper(width)
            lines = wrapper.wrap(line)
        return lines

    for row in rows:
        new = []
        for cell, width in zip(row, list(maxcolwidths) + [None] * (len(row) - len(maxcolwidths))):
            if width is None or _is_number(cell):
                new.append(cell)
                continue
            text = "" if cell is None else str(cell)
            new.append("\n".join("\n".join(wrap(line, width)) for line in text.split("\n") if line.strip() != ""))
        out.append(new)
    return out


def simple_table(rows: Sequence[Sequence], headers: Sequence[str] = (), floatfmt: str | Sequence[str] = "g",
                 maxcolwidths: Sequence[int | None] | None = None) -> str:
    """``tabulate(rows, headers=headers, floatfmt=floatfmt, maxcolwidths=maxcolwidths)`` (format "simple"; no
    headers: a rule above the rows and one below, as tabulate's)."""
    try:
        return _simple_table([list(r) for r in rows], list(headers), floatfmt, maxcolwidths)
    except _Unsupported:
        from tabulate import tabulate

        return tabulate(rows, headers=headers, floatfmt=floatfmt, maxcolwidths=maxcolwidths)


def _simple_table(rows: list[list], headers: list[str], floatfmt: str | Sequence[str],
                  maxcolwidths: Sequence[int | None] | None) -> str:
    width_of_row = len(headers) or (len(rows[0]) if rows else 0)   # headerless: tabulate's rule above and below
    if not rows or not width_of_row or any(len(r) != width_of_row for r in rows):
        raise _Unsupported
    for h in headers:
        if not (isinstance(h, str) and h.isascii() and h.isprintable()):
            raise _Unsupported
    for row in rows:   # every cell checked before wrapping, as tabulate reads it
        for cell in row:
            _kind(cell)
    if maxcolwidths is not None:
        rows = _wrapped(rows, maxcolwidths)
    multiline = any(isinstance(c, str) and "\n" in c for row in rows for c in row)
    columns = list(zip(*rows))
    fmts = [floatfmt] * len(columns) if isinstance(floatfmt, str) else \
        list(floatfmt) + ["g"] * (len(columns) - len(floatfmt))
    out_columns, aligns = [], []
    for header, column, fmt in zip(headers or [None] * width_of_row, columns, fmts):
        kind = max((_kind(c) if not (isinstance(c, str) and "\n" in c) else _STR for c in column), default=_NONE)
        kind = max(kind, 1)   # tabulate starts a column's type at bool
        cells = [_format(c, kind, fmt) for c in column]
        numeric = kind in (_INT, _FLOAT)
        if numeric:   # decimal alignment: pad each number to the most digits after the point
            points = [_after_point(s) for s in cells]
            most = max(points)
            cells = [s + (most - p) * " " for s, p in zip(cells, points)]
        else:
            cells = [s.strip() for s in cells]
        lines = [s.split("\n") if multiline else [s] for s in cells]
        width = max(max(len(line) for cell in lines for line in cell), len(header) + MIN_PADDING if headers else 0)
        pad = str.rjust if numeric else str.ljust
        out_columns.append([[pad(line, width) for line in cell] if cell != [""] or not multiline else []
                            for cell in lines])
        aligns.append((pad, width))
    rule = "  ".join("-" * w for _, w in aligns).rstrip()
    text = ["  ".join(pad(h, w) for h, (pad, w) in zip(headers, aligns)).rstrip(), rule] if headers else [rule]
    for r in range(len(rows)):
        cells = [col[r] for col in out_columns]
        height = max(len(c) for c in cells)
        for i in range(height):
            text.append("  ".join(c[i] if i < len(c) else " " * w for c, (_, w) in zip(cells, aligns)).rstrip())
    return "\n".join(text if headers else text + [rule])
