"""The package's layers and import rules (docs/architecture.md), checked on every module's source with ``ast``.

Three rules, each a test below; ``test_the_checker_finds_planted_defects`` feeds the checker a small
synthetic package with one defect of each kind, so that the checker itself cannot silently pass.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "dlguard"

# Lowest first. A module may import from its own layer and from any layer below it, never above.
# A module belongs to the layer of its longest listed prefix (``dlguard`` itself only matches exactly).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("dlguard._validation", "dlguard._random", "dlguard._own_random", "dlguard._distributed"),
    ("dlguard.metrics.functional",),
    ("dlguard.augment.functional",),
    ("dlguard.utilities",),
    ("dlguard.metrics",),
    ("dlguard.augment",),
    ("dlguard.probes",),
    ("dlguard.zoo",),
    ("dlguard.data",),
    ("dlguard.generate",),
    ("dlguard.report",),
    ("dlguard.callbacks",),
    ("dlguard", "dlguard.demo", "dlguard.cli"),
)
LAYER_OF_PREFIX = {prefix: index + 1 for index, prefixes in enumerate(LAYERS) for prefix in prefixes}
ROOT_PRIVATE_MODULES = LAYERS[0]


@dataclass(frozen=True)
class Module:
    name: str  # dotted, ``dlguard.metrics`` for ``dlguard/metrics/__init__.py``
    path: str  # shown in messages
    source: str
    is_package: bool

    @property
    def package(self) -> str:
        """The package a relative import starts from, and whose ``functional`` twin may share privates."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


@dataclass(frozen=True)
class Import:
    importer: Module
    line: int
    target: str  # the module imported: ``M``, or ``M.y`` for ``from M import y`` when ``y`` is a submodule
    name: str | None  # ``y`` of ``from M import y`` when ``y`` is not a submodule
    type_checking: bool  # under ``if TYPE_CHECKING:``, so never executed

    def __str__(self) -> str:
        imported = self.target if self.name is None else f"{self.target}:{self.name}"
        return f"{self.importer.path}:{self.line}  {self.importer.name} -> {imported}"


@dataclass(frozen=True)
class Circle:
    modules: tuple[str, ...]
    edges: tuple[tuple[Import, str], ...]  # each import inside the circle and the module it makes run

    def __str__(self) -> str:
        lines = [f"circle of {len(self.modules)} modules: {', '.join(self.modules)}"]
        for found, runs in self.edges:
            via = "" if runs == found.target else f"  (runs {runs.replace('.', '/')}/__init__.py first)"
            lines.append(f"    {found}{via}")
        return "\n".join(lines)


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    for end in range(len(parts), 1, -1):
        layer = LAYER_OF_PREFIX.get(".".join(parts[:end]))
        if layer is not None:
            return layer
    return LAYER_OF_PREFIX[PACKAGE] if module == PACKAGE else None


def top_package(module: str) -> str:
    """``dlguard.<top>``: the top-level subpackage (or root module) a module belongs to."""
    return ".".join(module.split(".")[:2])


def ancestors(module: str) -> list[str]:
    """The packages whose ``__init__`` Python runs before ``module``: ``dlguard``, ``dlguard.metrics``, …"""
    parts = module.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts))]


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def load_package(root: Path = ROOT / PACKAGE) -> list[Module]:
    modules = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        modules.append(Module(name, str(path.relative_to(root.parent)), path.read_text(), is_package))
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement (module level, in functions, under ``if``), and whether TYPE_CHECKING guards it."""
    guarded = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.If) and _is_type_checking(branch.test)
        for statement in branch.body
        for node in ast.walk(statement)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, id(node) in guarded


def imports_of(module: Module, known: set[str]) -> Iterator[Import]:
    """The imports of dlguard modules that ``module`` makes, relative ones resolved."""
    for node, type_checking in _import_nodes(ast.parse(module.source, module.path)):
        if isinstance(node, ast.Import):
            found = [(alias.name, None) for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                package = module.package.split(".")
                start = ".".join(package[: len(package) - node.level + 1])
                base = f"{start}.{base}" if base else start
            found = [
                (f"{base}.{alias.name}", None) if f"{base}.{alias.name}" in known else (base, alias.name)
                for alias in node.names
            ]
        for target, name in found:
            if target == PACKAGE or target.startswith(f"{PACKAGE}."):
                yield Import(module, node.lineno, target, name, type_checking)


def all_imports(modules: Iterable[Module]) -> list[Import]:
    modules = list(modules)
    known = {module.name for module in modules}
    found = [each for module in modules for each in imports_of(module, known)]
    return sorted(found, key=lambda each: (each.importer.path, each.line))


def unplaced_modules(modules: Iterable[Module]) -> list[str]:
    return [f"{module.path}  {module.name} has no layer" for module in modules if layer_of(module.name) is None]


def upward_imports(imports: Iterable[Import]) -> list[str]:
    found = []
    for each in imports:
        importer, imported = layer_of(each.importer.name), layer_of(each.target)
        if importer is not None and (imported is None or imported > importer):
            guard = ", under TYPE_CHECKING" if each.type_checking else ""
            found.append(f"{each}  (upward: layer {importer} imports layer {imported}{guard})")
    return found


def runtime_graph(imports: Iterable[Import]) -> dict[str, dict[str, Import]]:
    """Importer -> module executed because of it -> the import; parents' ``__init__`` are executed too."""
    graph: dict[str, dict[str, Import]] = {}
    for each in imports:
        if each.type_checking:
            continue
        importer = each.importer.name
        already_running = {*ancestors(importer), importer}
        runs = [each.target, *(parent for parent in ancestors(each.target) if parent not in already_running)]
        for module in runs:
            graph.setdefault(importer, {}).setdefault(module, each)
    return graph


def _reachable(graph: dict[str, dict[str, Import]], start: str) -> set[str]:
    seen: set[str] = set()
    stack = [start]
    while stack:
        for module in graph.get(stack.pop(), {}):
            if module not in seen:
                seen.add(module)
                stack.append(module)
    return seen


def import_circles(imports: Iterable[Import]) -> list[Circle]:
    """The strongly connected components of more than one module of the run-time import graph."""
    graph = runtime_graph(imports)
    reach = {module: _reachable(graph, module) for module in graph}
    circles: list[Circle] = []
    placed: set[str] = set()
    for module in sorted(graph):
        if module in placed or module not in reach[module]:
            continue
        members = tuple(sorted({module} | {other for other in reach[module] if module in reach.get(other, ())}))
        placed.update(members)
        if len(members) > 1:
            edges = tuple(
                (found, runs)
                for importer in members
                for runs, found in graph[importer].items()
                if runs in members and runs != importer
            )
            circles.append(Circle(members, edges))
    return circles


def _private_import_allowed(each: Import) -> bool:
    importer = each.importer.name
    if each.target in ROOT_PRIVATE_MODULES:
        return True
    private_module = any(is_private(part) for part in each.target.split("."))
    same_top = top_package(each.target) == top_package(importer)
    if private_module and not same_top:
        return False  # a private module belongs to its own top-level subpackage
    if each.name is None or not is_private(each.name):
        return True
    own_functional = f"{each.importer.package}.functional"
    return (
        (is_private(each.target.rpartition(".")[2]) and same_top)
        or each.target == own_functional
        or each.target.startswith(f"{own_functional}.")
    )


def private_imports(imports: Iterable[Import]) -> list[str]:
    found = []
    for each in imports:
        if not _private_import_allowed(each):
            if each.name is not None and is_private(each.name):
                why = "private name of another module: make it public, or share it from a private module"
            else:
                why = f"private module of {top_package(each.target)}, imported from outside it"
            found.append(f"{each}  ({why})")
    return found


@cache
def _package_imports() -> list[Import]:
    return all_imports(load_package())


def _report(title: str, problems: list[str]) -> str:
    return f"{len(problems)} {title} (see docs/architecture.md):\n" + "\n".join(problems)


def test_every_module_has_a_layer() -> None:
    problems = unplaced_modules(load_package())
    assert not problems, _report("modules outside every layer", problems)


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    problems = upward_imports(_package_imports())
    assert not problems, _report("upward imports", problems)


def test_no_import_circles() -> None:
    problems = [str(circle) for circle in import_circles(_package_imports())]
    assert not problems, _report("import circles", problems)


def test_no_private_names_imported_across_packages() -> None:
    problems = private_imports(_package_imports())
    assert not problems, _report("private imports across packages", problems)


PLANTED = {
    "dlguard/__init__.py": "",
    "dlguard/_validation.py": "def _check(): ...\n",
    "dlguard/metrics/__init__.py": "from dlguard.metrics.dscore import DScore\n",
    "dlguard/metrics/dscore.py": (
        "from dlguard._validation import _check\n"  # allowed: a root private module
        "from dlguard.metrics.functional.dscore import _update\n"  # allowed: the functional twin
        "class DScore:\n"
        "    def plot(self):\n"
        "        from dlguard.report.figures import plot_heatmaps\n"  # upward, and closes a circle
    ),
    "dlguard/metrics/functional/__init__.py": "",
    "dlguard/metrics/functional/dscore.py": "def _update(): ...\n",
    "dlguard/report/__init__.py": "",
    # runs dlguard/metrics/__init__.py first, which imports dscore, whose plot() imports figures
    "dlguard/report/figures.py": "from dlguard.metrics.functional.dscore import DScoreResult\n",
    "dlguard/probes/__init__.py": "",
    "dlguard/probes/_state.py": "_STATE = {}\n",
    "dlguard/probes/capture.py": (
        "from typing import TYPE_CHECKING\n"
        "from ._state import _STATE\n"  # allowed: a private module of its own subpackage
        "if TYPE_CHECKING:\n"
        "    from dlguard.generate.seeds import Seeds\n"  # upward, but never run: no circle with seeds
        "def _first_tensor(): ...\n"
    ),
    "dlguard/generate/__init__.py": "",
    "dlguard/generate/seeds.py": (
        "from dlguard.probes.capture import _first_tensor\n"  # a private name of another module
        "from dlguard.probes import _state\n"  # a private module of another subpackage
        "from dlguard.probes import capture\n"  # fine: a public submodule
    ),
}


def _planted_modules() -> list[Module]:
    modules = []
    for path, source in PLANTED.items():
        parts = path.removesuffix(".py").split("/")
        is_package = parts[-1] == "__init__"
        modules.append(Module(".".join(parts[:-1] if is_package else parts), path, source, is_package))
    return modules


def test_the_checker_finds_planted_defects() -> None:
    imports = all_imports(_planted_modules())
    assert unplaced_modules(_planted_modules()) == []
    assert upward_imports(imports) == [
        "dlguard/metrics/dscore.py:5  dlguard.metrics.dscore -> dlguard.report.figures:plot_heatmaps"
        "  (upward: layer 5 imports layer 11)",
        "dlguard/probes/capture.py:4  dlguard.probes.capture -> dlguard.generate.seeds:Seeds"
        "  (upward: layer 7 imports layer 10, under TYPE_CHECKING)",
    ]
    circles = import_circles(imports)
    assert [circle.modules for circle in circles] == [
        ("dlguard.metrics", "dlguard.metrics.dscore", "dlguard.report.figures")
    ]
    assert str(circles[0]).splitlines()[1:] == [
        "    dlguard/metrics/__init__.py:1  dlguard.metrics -> dlguard.metrics.dscore:DScore",
        "    dlguard/metrics/dscore.py:5  dlguard.metrics.dscore -> dlguard.report.figures:plot_heatmaps",
        "    dlguard/report/figures.py:1  dlguard.report.figures -> dlguard.metrics.functional.dscore:DScoreResult"
        "  (runs dlguard/metrics/__init__.py first)",
    ]
    assert private_imports(imports) == [
        "dlguard/generate/seeds.py:1  dlguard.generate.seeds -> dlguard.probes.capture:_first_tensor"
        "  (private name of another module: make it public, or share it from a private module)",
        "dlguard/generate/seeds.py:2  dlguard.generate.seeds -> dlguard.probes._state"
        "  (private module of dlguard.probes, imported from outside it)",
    ]


def test_relative_imports_and_submodules_resolve() -> None:
    modules = [
        Module("dlguard.augment", "a/__init__.py", "from .weather import RandomFog\n", True),
        Module("dlguard.augment.weather", "a/weather.py", "from .functional import weather as w\n", False),
        Module("dlguard.augment.functional", "a/f/__init__.py", "from ..functional.weather import fog\n", True),
        Module("dlguard.augment.functional.weather", "a/f/weather.py", "", False),
    ]
    assert [(each.target, each.name) for each in all_imports(modules)] == [
        ("dlguard.augment.weather", "RandomFog"),
        ("dlguard.augment.functional.weather", "fog"),
        ("dlguard.augment.functional.weather", None),
    ]
