"""planner/ in floors a reader can see: every import (run-time, inside functions and under TYPE_CHECKING alike) goes to
a lower floor or to a module of the same floor, and no chain of imports comes back to where it started.

The graph is built from the source (ast), not from what happens to be imported, so a new module must be given its
floor here: the test fails on a module it does not know.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PLANNER = Path(__file__).resolve().parents[1] / "planner"

FLOORS: dict[int, tuple[str, ...]] = {
    0: ("errors", "constants", "files", "hf_cache", "schema", "terms", "recompute_modes", "pipeline_split", "framework",
        "table", "dualpipe"),
    # ground: data-file primitives, the fitted constants, the term declarations, names of modes and frameworks, text
    # tables
    1: ("hf_config", "model", "model_facts", "hardware", "space", "rampup"),
    # specs: ModelSpec (shape, facts, parameters) and its config.json reader, the accelerator catalog and ClusterSpec,
    # TrainingSpec and Candidate
    2: ("attention", "topology", "recompute", "step_context", "flops", "fp8", "fsdp_parallel", "pipeline_engine",
        "cuda_graphs",
        "context_parallel", "moe", "ops", "offload", "memory", "cost", "calibration"),
    # operations and terms: a layer's list of operations, memory, the step's named terms
    3: ("rules", "constraints", "enumeration", "rank", "rampup_schedule"),
    # rules and ranking
    4: ("emit", "emit.facts", "emit.setup", "emit.parallel_extras", "emit.plan_yaml", "emit.megatron_lm",
        "emit.megatron_deepspeed", "emit.fsdp", "emit.torchtitan_py", "emit.sbatch", "emit.write"),
    # files out: what each framework launches
    5: ("cli", "__main__", ""),
    # faces: the `plan` command and the package's API (planner/__init__.py, "")
}
FLOOR = {name: floor for floor, names in FLOORS.items() for name in names}


def _module(path: Path) -> str:
    rel = path.relative_to(PLANNER).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


@functools.lru_cache(maxsize=1)
def import_graph() -> dict[str, frozenset[str]]:
    """planner module -> the planner modules it imports ("" is the package itself)."""
    modules = {_module(p): p for p in PLANNER.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".") if package else []
                    base = base[:len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                elif node.module and node.module.split(".")[0] == "planner":
                    target = node.module.partition(".")[2]
                else:
                    continue
                for alias in node.names:   # `from planner import moe` names a module; `from planner import plan` not
                    sub = f"{target}.{alias.name}" if target else alias.name
                    deps.add(sub if sub in modules else target)
            elif isinstance(node, ast.Import):
                deps.update(a.name.partition(".")[2] for a in node.names if a.name.split(".")[0] == "planner")
        deps.discard(name)
        graph[name] = frozenset(deps)
    return graph


def cycles(graph: dict[str, frozenset[str]] | dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_floor():
    unknown = sorted(set(import_graph()) - set(FLOOR))
    assert not unknown, f"give these planner modules a floor in tests/test_layers.py FLOORS: {unknown}"


def test_imports_go_down_or_across():
    up = [f"{m} (floor {FLOOR[m]}) imports {d or 'planner'} (floor {FLOOR[d]})"
          for m, deps in sorted(import_graph().items()) for d in sorted(deps)
          if m in FLOOR and d in FLOOR and FLOOR[d] > FLOOR[m]]
    assert not up, "imports that go up a floor:\n" + "\n".join(up)


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, f"import cycles in planner/: {found}"


def test_the_check_finds_a_cycle():
    """The cycle finder itself: a two-module circle and a three-module one are found, a chain is not."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


@pytest.mark.parametrize("module, imports", [("cost", "step_context"), ("model", "errors"), ("moe", "model"),
                                             ("cli", "rank")])
def test_the_graph_reads_the_source(module, imports):
    """Known edges are in the graph (the parser follows `from planner import x`, `from planner.x import y`)."""
    assert imports in import_graph()[module]
