"""The documentation names only code that exists (issue 20: docs kept pointing at moved modules).

Scanned: ``README.md``, ``docs/*.md`` and ``experiments/results/README.md`` — the pages a reader follows —
not committed logs and result artefacts, which keep the names of the day they were written. Checked:

* every backticked repository path under ``digenrl/``, ``experiments/``, ``paper_figures/``, ``tests/`` or
  ``docs/`` exists (``*`` globs must match something, ``{a,b}`` expands, ``::test`` selectors are dropped);
* every backticked dotted name ``digenrl.x.y[.Name[.attr]]`` is a module, or a name that module defines
  (read with ``ast``: no import, so the check is fast and needs no torch);
* every relative Markdown link points at a file or folder that exists.
"""

from __future__ import annotations

import ast
import itertools
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted(
    [ROOT / "README.md", ROOT / "experiments" / "results" / "README.md", *(ROOT / "docs").glob("*.md")]
)

_BACKTICKED = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"(?<![\w/.-])((?:digenrl|experiments|paper_figures|tests|docs)/[\w/.*{},<>-]*)")
_DOTTED = re.compile(r"(?<![\w/.-])(digenrl(?:\.\w+)+)")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
#: the package's folders: a page's `gap/fragments.py` or `systems/phases.train_logical_batch` is in digenrl
_SUBPACKAGES = "|".join(sorted(p.name for p in (ROOT / "digenrl").iterdir() if (p / "__init__.py").is_file()))
_RELATIVE = re.compile(rf"(?<![\w/.-])((?:{_SUBPACKAGES})(?:/\w+)+)(?:\.py)?((?:\.\w+)*)(?![\w/-])")


def _expand_braces(path: str) -> list[str]:
    """``a/{b,c}.py`` → ``a/b.py``, ``a/c.py`` (as a shell would)."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def _path_exists(path: str) -> bool:
    path = path.split("::")[0].rstrip(".,;:)")
    if "<" in path:  # a placeholder (`digenrl/models/families/<family>.py`): check the folder above it
        path = path[: path.index("<")].rsplit("/", 1)[0]
    for candidate in _expand_braces(path):
        if "*" in candidate:
            if not any(ROOT.glob(candidate)):
                return False
        elif not (ROOT / candidate).exists():
            return False
    return True


@cache
def _top_level_names(module_file: Path) -> dict[str, ast.AST]:
    """Names a module defines at top level (also under ``if`` / ``try``), each with its defining node."""
    names: dict[str, ast.AST] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names[node.name] = node
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            names[name.id] = node
            elif isinstance(node, ast.Import | ast.ImportFrom):
                for alias in node.names:
                    names[alias.asname or alias.name.split(".")[0]] = node
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(ast.parse(module_file.read_text(encoding="utf-8")).body)
    return names


def _module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _class_defines(node: ast.ClassDef, name: str) -> bool:
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and item.name == name:
            return True
        if isinstance(item, ast.AnnAssign | ast.Assign):
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
    return False


def _resolves(dotted: str) -> bool:
    """``dotted`` is a module, or the longest module prefix defines the next name (and, for a class, the
    name after it); a name re-exported by ``from m import x`` is followed to ``m``."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        module = _module_file(parts[:split])
        if module is None:
            continue
        rest = parts[split:]
        if not rest:
            return True
        node = _top_level_names(module).get(rest[0])
        if node is None:
            return False
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("digenrl"):
            original = next(a.name for a in node.names if (a.asname or a.name) == rest[0])
            return _resolves(".".join([node.module, original, *rest[1:]]))
        if len(rest) == 1:
            return True
        return isinstance(node, ast.ClassDef) and len(rest) == 2 and _class_defines(node, rest[1])
    return False


def _relative_ok(path: str, attrs: str) -> bool:
    """A package-relative ``pkg/module[.py][.name]`` (or folder) exists under ``digenrl/``."""
    parts = ["digenrl", *path.split("/")]
    if (ROOT.joinpath(*parts)).is_dir() and not attrs:
        return True
    return _module_file(parts) is not None and _resolves(".".join(parts) + attrs)


def stale_references(text: str, where: Path) -> list[str]:
    """Every path, dotted name or relative link in ``text`` (a Markdown page at ``where``) that does not
    exist, as ``line N: reference``."""
    stale = []
    for number, line in enumerate(text.splitlines(), 1):
        for span in _BACKTICKED.findall(line):
            stale += [f"line {number}: {p}" for p in _PATH.findall(span) if not _path_exists(p)]
            stale += [f"line {number}: {d}" for d in _DOTTED.findall(span) if not _resolves(d)]
            stale += [f"line {number}: {p}{a}" for p, a in _RELATIVE.findall(span) if not _relative_ok(p, a)]
        for target in _LINK.findall(line):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (where.parent / target.split("#")[0]).exists():
                stale.append(f"line {number}: link {target}")
    return stale


def test_the_documents_are_there():
    names = {p.relative_to(ROOT).as_posix() for p in DOCUMENTS}
    assert {"README.md", "docs/README.md", "docs/design.md", "experiments/results/README.md"} <= names


def test_every_named_module_path_and_link_exists():
    stale = {
        doc.relative_to(ROOT).as_posix(): found
        for doc in DOCUMENTS
        if (found := stale_references(doc.read_text(encoding="utf-8"), doc))
    }
    assert not stale, f"documentation names what does not exist (fix the name or the page): {stale}"


def test_the_checker_finds_names_that_moved():
    """The names issue 20 found stale are caught; the ones that replaced them pass."""
    page = ROOT / "docs" / "design.md"
    moved = [
        "`digenrl/sim/costs.py`",
        "`digenrl.sim.measure`",
        "`digenrl.rollout.trajectory.TrajectoryBatch`",
        "`digenrl.data.trajectory.TrajectoryBatch.no_such_method`",
        "`experiments/run_profile.py`",
        "`tests/systems/test_nothing.py::test_x`",
        "[x](no_such_page.md)",
        "`trainer/micro_batches.split_units`",
        "`sim/measure.py`",
        "`runtime/residency.py`",
    ]
    assert [len(stale_references(text, page)) for text in moved] == [1] * len(moved)
    current = [
        "`digenrl/costs/cost_model.py`",
        "`digenrl.costs.CostModel.load`",  # a re-exported class and its method
        "`digenrl.trainer.full_trainer_state`",
        "`digenrl/runtime/hardware/hardware_profiles/*.yaml`",
        "`experiments/results/costs/h200-{sd3.5-medium,qwen-image}.json`",
        "`digenrl/models/families/<family>.py`",
        "`python -m digenrl.rewards.serve --port P`",
        "[x](algorithm.md#loss)",
        "`data/micro_batches.split_units`",
        "`gap/fragments.py`",
        "`systems/phases.train_logical_batch`",
        "`runtime/`",
        "`costs/h200-sd3.5-medium.json`",  # relative to experiments/results: not a package path
        "`tsp.stages`",  # a config key
    ]
    assert [text for text in current if stale_references(text, page)] == []


def test_the_model_family_table_lists_every_field():
    """docs/models.md's table of ``ModelFamily`` fields names each field (``name`` aside), so a required
    field such as ``pipeline_class`` is not left for a family author to discover by a TypeError."""
    tree = ast.parse((ROOT / "digenrl" / "models" / "family.py").read_text(encoding="utf-8"))
    family = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelFamily")
    fields = [
        n.target.id for n in family.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    ]
    page = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(\w+)` \|", page, flags=re.MULTILINE))
    assert fields and set(fields) - {"name"} <= rows, sorted(set(fields) - {"name"} - rows)
