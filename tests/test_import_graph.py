"""The import graph of phantora/ and interpose/: no cycles, and the layers the design promises.

Imports are read from the source (ast), so every import counts: module level, inside
functions, and under `if TYPE_CHECKING:`. `from pkg import name` is an edge to the submodule
`pkg.name` when there is one, else to `pkg` (its __init__).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("phantora", "interpose")


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def _imported(module: str, path: Path, node: ast.Import | ast.ImportFrom, mods: dict[str, Path]) -> list[str]:
    """Every module name `node` imports (inside or outside our packages)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in mods else prefix for alias in node.names]


def import_graph() -> dict[str, set[str]]:
    """module -> the modules it imports; targets outside our packages kept as written."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _imported(module, path, node, mods):
                    while target not in mods and "." in target and target.split(".")[0] in PACKAGES:
                        target = target.rsplit(".", 1)[0]  # pkg.module.attr -> pkg.module
                    if target != module:
                        graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root] & graph.keys())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child] & graph.keys()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_among_phantora_and_interpose_modules() -> None:
    graph = import_graph()
    assert len(graph) > 100  # both packages were read
    cycles = _cycles(graph)
    assert not cycles, "modules that import each other (directly or through others):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_the_simulator_core_never_imports_torch() -> None:
    # phantora/net and phantora/engine run in the simulator process, which need not have torch.
    graph = import_graph()
    offenders = {m: sorted(t for t in targets if t == "torch" or t.startswith("torch."))
                 for m, targets in graph.items() if m.startswith(("phantora.net", "phantora.engine"))}
    assert not {m: t for m, t in offenders.items() if t}


def test_phantora_imports_interpose_only_from_the_launcher() -> None:
    # The simulator side reads what rank processes send; only `phantora trace`'s launcher needs
    # interpose (where the bootstrap lives, the env names it reads; the fork server's side of it
    # names the variables a warm server may ignore).
    graph = import_graph()
    users = sorted(m for m, targets in graph.items()
                   if m.startswith("phantora") and any(t.split(".")[0] == "interpose" for t in targets))
    assert users == ["phantora.simulator.forkserver", "phantora.simulator.launch"]
