"""CI installs with ``.ci/constraints.txt`` (the versions it was last green with); the README's plain install
uses setup.py's ranges. The two must agree: a pin outside a range would make CI test a combination no user
can install, or fail to resolve (docs/operations.md, "Installing and the test suite")."""

from __future__ import annotations

import ast
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]


def pins() -> dict[str, Version]:
    out = {}
    for line in (REPO / ".ci" / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f".ci/constraints.txt: {line!r} is not a name==version pin"
            out[canonicalize_name(name)] = Version(version)
    return out


def setup_requirements() -> list[Requirement]:
    """install_requires and the cpu/test extras (what .ci/run installs), read from setup.py's AST."""
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    kw = {
        k.arg: ast.literal_eval(k.value)
        for k in call.keywords
        if k.arg in ("install_requires", "extras_require")
    }
    names = kw["install_requires"] + kw["extras_require"]["cpu"] + kw["extras_require"]["test"]
    return [Requirement(r) for r in names]


def test_every_requirement_ci_installs_is_pinned_inside_setup_py_range():
    pinned = pins()
    for req in setup_requirements():
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req.name} is installed by .ci/run but not pinned in .ci/constraints.txt"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f".ci/constraints.txt pins {req.name}=={pinned[name]}, outside setup.py's {req}"
        )


def test_ci_installs_with_the_constraints():
    run = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert 'pip install -c .ci/constraints.txt -e ".[cpu,test]"' in run
    assert "python -m pytest -q" in run
