"""The package's import structure (docs/design.md §6): no cycle between files or folders, every import
points down the layer order, and nothing in the library reaches into the checkout.

Imports are read with ``ast`` (lazy imports inside functions count too: a cycle through a function-level
import is still a cycle a reader has to untangle). Layers, bottom to top; a module may import its own
layer's siblings and anything below, never above. ``perf``, ``reports`` and ``export`` stand beside the
stack: they may import anything of it, and nothing of the stack may import them.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "digenrl"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("config", "dependency_logs"),
    ("data", "algo", "rules"),
    ("models", "rewards"),
    ("runtime",),
    ("rollout", "trainer"),
    ("gap", "tsp", "async_policy", "costs", "plan", "sim"),
    ("planning", "tag"),
    ("systems",),
    ("validation", "launch"),
)
SIDE = ("perf", "reports", "export")
#: the one module of the simulator the runtime may use: TAG's prediction, which a system hands to TAG
RUNTIME_MAY_USE_FROM_SIM = {"digenrl.sim.predict"}
#: folders that never import the simulator at all (TAG decides through a predictor it is handed)
NEVER_IMPORT_SIM = ("tag", "runtime")
RUNTIME = ("runtime", "rollout", "trainer", "gap", "tsp", "async_policy", "tag", "systems", "launch")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The ``digenrl.*`` modules ``path`` imports (``from digenrl.x import y`` counts as ``digenrl.x.y`` when
    that is a module, else ``digenrl.x``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "digenrl")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "digenrl":
                continue
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                out.add(candidate if candidate in MODULES else node.module)
    return {m for m in out if m != "digenrl"}


FILES = sorted(PACKAGE.rglob("*.py"))
MODULES = {_module_name(p): p for p in FILES}
GRAPH = {name: _imports(path) - {name} for name, path in MODULES.items()}


def _folder(module: str) -> str:
    """``digenrl.sim.schedules.colocated`` → ``sim``; ``digenrl.config`` → ``config``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_file_level_import_cycle():
    assert _cycles(GRAPH) == []


def test_no_folder_level_import_cycle():
    folders: dict[str, set[str]] = defaultdict(set)
    for module, targets in GRAPH.items():
        for target in targets:
            if _folder(target) != _folder(module):
                folders[_folder(module)].add(_folder(target))
    assert _cycles(dict(folders)) == []


def test_no_import_cycle_between_the_subfolders_of_a_folder():
    """Inside a folder, its subfolders (``runtime/comm``, ``runtime/observe``, …) import each other one way
    only, so each reads as one job built on the ones below it."""
    for top in sorted({_folder(m) for m in MODULES}):
        subfolders: dict[str, set[str]] = defaultdict(set)
        for module, targets in GRAPH.items():
            parts = module.split(".")
            if parts[1:2] != [top] or len(parts) < 4:
                continue
            for target in targets:
                other = target.split(".")
                if other[1:2] == [top] and len(other) >= 4 and other[2] != parts[2]:
                    subfolders[parts[2]].add(other[2])
        assert _cycles(dict(subfolders)) == [], top


def _layer(folder: str) -> int | None:
    for i, names in enumerate(LAYERS):
        if folder in names:
            return i
    return None


def test_every_folder_has_a_layer():
    folders = {_folder(m) for m in MODULES if m != "digenrl"}
    unplaced = sorted(f for f in folders if _layer(f) is None and f not in SIDE)
    assert unplaced == [], f"place these in LAYERS or SIDE (docs/design.md §6): {unplaced}"


def test_imports_point_down_the_layers():
    upward = []
    for module, targets in GRAPH.items():
        source = _folder(module)
        for target in targets:
            dest = _folder(target)
            if source in SIDE:
                continue
            if dest in SIDE:
                upward.append(f"{module} -> {target} (nothing of the stack imports {dest}/)")
            elif _layer(dest) is not None and _layer(source) is not None and _layer(dest) > _layer(source):
                upward.append(f"{module} -> {target}")
    assert upward == []


def _simulator_imports(folders: tuple[str, ...], allowed: set[str] | None = None) -> list[str]:
    """Imports of ``sim/`` or ``planning/`` modules (but ``allowed``) by modules of ``folders``."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if _folder(module) in folders
        for target in targets
        if _folder(target) in ("sim", "planning") and target not in (allowed or set())
    )


def test_runtime_asks_the_simulator_one_question():
    assert _simulator_imports(RUNTIME, RUNTIME_MAY_USE_FROM_SIM) == []


def test_the_library_does_not_reach_into_the_checkout():
    offenders = []
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        for needle in ('/ "experiments"', "/ 'experiments'", '/ "hardware_profiles"', "import experiments"):
            if needle in text:
                offenders.append(f"{path.relative_to(PACKAGE.parent)}: {needle}")
    assert offenders == []


def test_tag_and_runtime_never_import_the_simulator():
    assert _simulator_imports(NEVER_IMPORT_SIM) == []
