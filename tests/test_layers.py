"""The house shows its layers: each package imports only its own floor and those below.

Every import in every product module counts, lazy ones inside functions too (they are
found with the ast module, not by importing). docs/architecture.md draws the same floors.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bootfsm.core.codes import Code

REPO = Path(__file__).resolve().parents[1]

#: Floors, bottom first. A module may import its own floor and any floor below it.
FLOORS: list[tuple[str, ...]] = [
    ("core", "__init__"),  # bootfsm/__init__.py holds only __version__
    ("parsers", "sim"),  # pure readers of outside input; the simulator (test support)
    ("host",),
    ("node",),
    ("observe",),
    ("machine",),
    ("fetch",),
    ("install",),
    ("states",),
    ("run",),
    ("image",),
    ("commands",),
    ("cli", "__main__"),
]
FLOOR = {name: n for n, names in enumerate(FLOORS) for name in names}
MAX_MODULE_LINES = 400
MAX_STATE_LINES = 200


def _package(path: Path) -> str:
    rel = path.relative_to(REPO)
    if rel.parts[0] == "states":
        return "states"
    parts = rel.parts[1:]  # below bootfsm/
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def _modules() -> list[Path]:
    found = [p for p in (REPO / "bootfsm").rglob("*.py") if "states" not in p.parts]
    return sorted(found + list((REPO / "states").glob("*.py")))


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = (
                [node.module]
                if node.module != "bootfsm"
                else [f"bootfsm.{a.name}" for a in node.names]
            )
            out += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return [(line, n) for line, n in out if n == "bootfsm" or n.startswith("bootfsm.")]


def _target(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_no_package_imports_a_floor_above_it() -> None:
    wrong = []
    for path in _modules():
        here = _package(path)
        for line, module in _imports(path):
            there = _target(module)
            if there == "__version__":
                continue
            if FLOOR[there] > FLOOR[here]:
                wrong.append(f"{path.relative_to(REPO)}:{line} ({here}) imports {module} ({there})")
    assert not wrong, "\n".join(wrong)


def test_every_package_has_a_floor() -> None:
    packages = {_package(p) for p in _modules()}
    assert packages <= set(FLOOR), packages - set(FLOOR)


def test_the_flat_package_holds_only_the_entry_points() -> None:
    flat = sorted(p.name for p in (REPO / "bootfsm").glob("*.py"))
    assert flat == ["__init__.py", "__main__.py", "cli.py"]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_module_size(path: Path) -> None:
    """States read as one state (< 200 lines); no module (the simulator's too) grows past
    400, except the exit-code table, which is one table (one row per code) by design."""
    lines = len(path.read_text().splitlines())
    limit = MAX_STATE_LINES if path.parent.name == "states" else MAX_MODULE_LINES
    if path.relative_to(REPO) == Path("bootfsm/core/codes.py"):
        limit = 8 * len(Code) + 40  # a row of at most eight lines per code, and the frame
    assert lines <= limit, f"{path.relative_to(REPO)}: {lines} lines > {limit}"


def test_no_import_cycle_between_modules() -> None:
    graph: dict[str, set[str]] = {}
    for path in _modules():
        rel = path.relative_to(REPO).with_suffix("")
        name = ".".join(("bootfsm", *rel.parts) if rel.parts[0] == "states" else rel.parts)
        name = name.removesuffix(".__init__")
        graph[name] = {m for _, m in _imports(path)}
    known = set(graph)
    seen: dict[str, int] = {}
    cycles: list[str] = []

    def visit(node: str, stack: list[str]) -> None:
        seen[node] = 1
        for dep in sorted(graph.get(node, ())):
            while dep not in known and "." in dep:  # from pkg.mod import name
                dep = dep.rsplit(".", 1)[0]
            if dep not in known or dep == node or node.startswith(dep + "."):
                continue
            if seen.get(dep) == 1:
                cycles.append(" -> ".join([*stack[stack.index(dep) :], dep]))
            elif dep not in seen:
                visit(dep, [*stack, dep])
        seen[node] = 2

    for node in sorted(graph):
        if node not in seen:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)
