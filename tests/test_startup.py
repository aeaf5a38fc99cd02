"""planner.files.dataclass_code_cache: the dataclasses' generated methods compiled once, then read back (issue 29
point 5, `plan`'s start-up)."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from planner import files


def _define(extra_field: bool = False):
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Spec:
        name: str
        layers: int = 4
        sizes: tuple[int, ...] = ()
        if extra_field:
            heads: int = 8
    return Spec


def _behaves(cls) -> None:
    a, b = cls(name="x", sizes=(1, 2)), cls(name="x", sizes=(1, 2))
    assert a == b and hash(a) == hash(b) and a != cls(name="y")
    assert repr(a) == "_define.<locals>.Spec(name='x', layers=4, sizes=(1, 2))"
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.layers = 5
    assert dataclasses.replace(a, layers=6).layers == 6 and [f.name for f in dataclasses.fields(a)][:3] == [
        "name", "layers", "sizes"]


def test_the_generated_methods_are_compiled_once_then_read_back(tmp_path, monkeypatch):
    cache = tmp_path / "dataclasses.marshal"
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    with files.dataclass_code_cache(cache):
        _behaves(_define())
    assert not cache.exists() and "exec" not in vars(dataclasses)   # none written; dataclasses' exec restored
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    with files.dataclass_code_cache(cache):
        _behaves(_define())
    assert cache.is_file() and "exec" not in vars(dataclasses)
    monkeypatch.setattr(files, "compile", lambda *a, **k: pytest.fail("compiled again"), raising=False)
    with files.dataclass_code_cache(cache):
        _behaves(_define())
    monkeypatch.delattr(files, "compile")
    written = cache.read_bytes()
    with files.dataclass_code_cache(cache):   # a changed class compiles anew, and the cache is rewritten
        cls = _define(extra_field=True)
    assert cls(name="x").heads == 8 and cache.read_bytes() != written
    cache.write_bytes(b"not marshal data")   # a broken cache is compiled again
    with files.dataclass_code_cache(cache):
        _behaves(_define())
    assert "exec" not in vars(dataclasses)


def test_the_package_imports_no_differently_with_its_cache():
    """The package's classes are dataclasses as before: fields, frozen, generated repr."""
    from planner import Candidate, ModelSpec

    assert dataclasses.is_dataclass(Candidate) and dataclasses.is_dataclass(ModelSpec)
    assert Candidate.__init__.__code__.co_filename == "<string>"   # as dataclasses' own exec names it
    assert "exec" not in vars(dataclasses)
