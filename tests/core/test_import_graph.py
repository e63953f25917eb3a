"""The package's structure, read from its source files' syntax trees (nothing is imported): no
import cycle between modules, and the layers of docs/layout.md kept, with no arrow running back up
and no loop between packages.

The graph: an edge goes from a module to every `wdsprep` module it imports, anywhere in its body (a
cycle or an upward import held open by a function-level import counts all the same), to the module
that DEFINES each name it imports: `from PKG import NAME` goes to `PKG.NAME` when that is a module,
else it follows PKG's re-export of NAME (`from .mod import NAME` in PKG) or PKG's lazy name for it
(the package root's `_LAZY` and `_SUBMODULES`, `stream`'s `_LAZY`, a source package's
`lazy_exports(__name__, {...})` table) to the module that defines it, so an import through a
package's re-export or lazy name cannot hide where it lands. A module's own lazy names are edges of
that module, and so is `importlib.import_module("literal")`. A package's `__init__` running before
its submodules is Python's doing, not an import the code asks for, so it is not an edge.

The layers: docs/layout.md's "Layers" table, top first, names each package and module of
`src/wdsprep` (the package root as `wdsprep`) in one layer. Every module is in a layer; an edge
between two of them runs to the same layer or one below (`arrows_up` lists the others), and the
graph of the packages and root modules (each package one node) has no loop (`package_loops`).

The last tests measure what importing actually loads: a conversion (any source's convert module)
and the command line's help load neither httpx, trio nor torch, each checked in a fresh interpreter.
"""
from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from tests.timeouts import SUBPROCESS
from wdsprep.sources.registry import BUILTIN

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"
LAYOUT = SRC.parent / "docs" / "layout.md"


def module_files(root: pathlib.Path = SRC / "wdsprep") -> dict[str, pathlib.Path]:
    """Module name -> file, for every module of the package (packages by their `__init__.py`)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


@dataclass
class ModuleSource:
    """What one module's syntax tree says about its imports and names."""

    name: str
    path: pathlib.Path
    tree: ast.Module = field(init=False)
    reexports: dict = field(default_factory=dict)  # NAME -> (module, its name there): module-level `from X import N`
    lazy: dict = field(default_factory=dict)  # NAME -> module that defines it, loaded on first use
    dynamic: set = field(default_factory=set)  # modules named by import_module("literal")

    def __post_init__(self):
        self.tree = ast.parse(self.path.read_text(), str(self.path))
        for node in self.tree.body:
            if isinstance(node, ast.ImportFrom):
                origin = _resolve(self.name, self.is_package, node.level, node.module)
                for alias in node.names:
                    self.reexports[alias.asname or alias.name] = (origin, alias.name)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign) and any(isinstance(target, ast.Name) for target in node.targets):
                names = {target.id for target in node.targets if isinstance(target, ast.Name)}
                if "_LAZY" in names:
                    self._table(node.value)
                elif "_SUBMODULES" in names:
                    self.lazy.update({element.value: f"{self.package}.{element.value}" for element in node.value.elts})
            elif isinstance(node, ast.Call):
                called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if called == "lazy_exports" and len(node.args) == 2:
                    self._table(node.args[1])
                elif called == "import_module" and node.args and isinstance(node.args[0], ast.Constant):
                    self.dynamic.add(self._module(node.args[0].value))

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]

    def _module(self, value: str) -> str:
        """A module named in a lazy table: absolute, relative (`.read`), or a bare submodule name."""
        if value.startswith("."):
            level = len(value) - len(value.lstrip("."))
            return _resolve(self.name, self.is_package, level, value.lstrip(".") or None)
        return value if "." in value else f"{self.package}.{value}"

    def _table(self, node: ast.expr) -> None:
        """{NAME: module | (module, attribute), **dict.fromkeys([NAME, ...], module)} or dict.fromkeys(...)."""
        if isinstance(node, ast.Call):  # dict.fromkeys([NAME, ...], module)
            names, target = node.args
            self.lazy.update({element.value: self._module(target.value) for element in names.elts})
            return
        for key, value in zip(node.keys, node.values):
            if key is None:
                self._table(value)
            else:
                target = value.elts[0] if isinstance(value, ast.Tuple) else value
                self.lazy[key.value] = self._module(target.value)


def read_modules(root: pathlib.Path = SRC / "wdsprep") -> dict[str, ModuleSource]:
    return {name: ModuleSource(name, path) for name, path in module_files(root).items()}


def defining_module(modules: dict[str, ModuleSource], module: str, name: str, seen: frozenset = frozenset()) -> str:
    """The module that defines `name` as `from module import name` finds it: a submodule of that
    name, else through `module`'s lazy name or re-export of it, else `module` itself."""
    if f"{module}.{name}" in modules:
        return f"{module}.{name}"
    source = modules.get(module)
    if source is None or (module, name) in seen:
        return module
    seen = seen | {(module, name)}
    if name in source.lazy:
        return defining_module(modules, source.lazy[name], name, seen)
    if name in source.reexports:
        origin, original = source.reexports[name]
        if origin in modules:
            return defining_module(modules, origin, original, seen)
    return module


def imports_of(modules: dict[str, ModuleSource], module: str) -> set[str]:
    """The package modules that `module` imports, wherever in the file, each where its names are defined."""
    source = modules[module]
    found = set()
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                found.update(next(([".".join(parts[:end])] for end in range(len(parts), 0, -1)
                                   if ".".join(parts[:end]) in modules), []))
        elif isinstance(node, ast.ImportFrom):
            origin = _resolve(module, source.is_package, node.level, node.module)
            if origin in modules:
                found.update(defining_module(modules, origin, alias.name) for alias in node.names)
    found.update(target for target in (*source.lazy.values(), *source.dynamic) if target in modules)
    found.discard(module)
    return found


def import_graph(root: pathlib.Path = SRC / "wdsprep") -> dict[str, set[str]]:
    modules = read_modules(root)
    return {module: imports_of(modules, module) for module in modules}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (iterative depth-first search, colours white/grey/black)."""
    colour = dict.fromkeys(graph, 0)
    for start in sorted(graph):
        if colour[start]:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(child) == 1:
                return path[path.index(child):] + [child]
            elif colour.get(child) == 0:
                colour[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph[child]))))
    return None


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# -- the layers of docs/layout.md: no arrow back up, no loop between packages


def node_of(module: str) -> str:
    """The package or root module a module belongs to: `wdsprep.stream.reading.read` -> `stream`,
    `wdsprep.cli` -> `cli`, the package root `wdsprep` -> `wdsprep`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layers_of(layout: str) -> dict[str, int]:
    """Node -> layer number (0 the ground) from the "Layers" table of docs/layout.md: one row per
    layer, top first, the first cell naming its packages and modules in backticks."""
    section = layout.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and not set(line) <= set("|-: ")]
    names = [re.findall(r"`([^`]+)`", row.split("|")[1]) for row in rows[1:]]  # the header row left out
    layers = {}
    for number, row in enumerate(reversed(names)):
        for name in row:
            assert name not in layers, f"{name} is in two layers"
            layers[name] = number
    return layers


def node_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph of the packages and root modules: an edge where a module of one imports a module of another."""
    nodes: dict[str, set[str]] = {}
    for module, targets in graph.items():
        nodes.setdefault(node_of(module), set()).update(node_of(target) for target in targets)
    return {node: targets - {node} for node, targets in nodes.items()}


def arrows_up(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    """Every import from a module to a module of a higher layer, as `importer -> imported`."""
    return sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets
                  if layers[node_of(target)] > layers[node_of(module)])


def package_loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The loops between packages and root modules: each set of nodes that reach each other (a
    strongly connected component of more than one node), sorted; Tarjan's algorithm, iterative."""
    nodes = node_graph(graph)
    index, low, stack, on_stack, loops = {}, {}, [], set(), []
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(nodes[start])))]
        index[start] = low[start] = len(index)
        stack.append(start), on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
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
                        loops.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child), on_stack.add(child)
                work.append((child, iter(sorted(nodes.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(loops)


def test_every_package_and_root_module_is_in_one_layer():
    layers = layers_of(LAYOUT.read_text())
    nodes = {node_of(module) for module in import_graph()}
    assert sorted(nodes - set(layers)) == [], "not in docs/layout.md's Layers table"
    assert sorted(set(layers) - nodes) == [], "in docs/layout.md's Layers table, but no such package or module"


def test_no_import_runs_back_up_between_the_layers():
    """0 arrows back up (the count is in the assertion's message when it fails)."""
    up = arrows_up(import_graph(), layers_of(LAYOUT.read_text()))
    assert up == [], f"{len(up)} imports run back up between the layers of docs/layout.md:\n" + "\n".join(up)


def test_no_loop_between_packages():
    """0 loops between the packages and root modules."""
    loops = package_loops(import_graph())
    assert loops == [], f"{len(loops)} loops between packages: {loops}"


# -- the checker itself, on graphs and files small enough to check by eye


def write_package(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root / "pkg"


def test_find_cycle_finds_a_lazy_two_module_cycle(tmp_path):
    package = write_package(tmp_path, {"pkg/__init__.py": "", "pkg/sub/__init__.py": "from . import a\n",
                                       "pkg/sub/a.py": "from ..b import thing\n",
                                       "pkg/b.py": "def thing():\n    from .sub import a\n    return a\n"})
    graph = import_graph(package)
    assert graph == {"pkg": set(), "pkg.sub": {"pkg.sub.a"}, "pkg.sub.a": {"pkg.b"}, "pkg.b": {"pkg.sub.a"}}
    assert find_cycle(graph) == ["pkg.b", "pkg.sub.a", "pkg.b"]


def test_find_cycle_accepts_a_diamond():
    graph = {"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}
    assert find_cycle(graph) is None
    assert find_cycle(dict(graph, d={"a"})) in (["a", "b", "d", "a"], ["a", "c", "d", "a"])


# a package like wdsprep: `low` at the bottom, `top` above it; the root's lazy name `Driver` is
# top's, `low.mid` re-exports `name` from `low.mid.impl`, a source-style package has a lazy table
LAYERED = {
    "pkg/__init__.py": ('import importlib\n_LAZY = {"Driver": ("pkg.top", "Driver")}\n_SUBMODULES = ("top",)\n'
                        "def __getattr__(name):\n    return getattr(importlib.import_module(_LAZY[name][0]), name)\n"),
    "pkg/top.py": "from .low.mid import name\nclass Driver:\n    pass\n",
    "pkg/low/__init__.py": "",
    "pkg/low/mid/__init__.py": "from .impl import name\n",
    "pkg/low/mid/impl.py": "name = 1\n",
    "pkg/low/lazy/__init__.py": 'from ... import lazy_exports\n__getattr__ = lazy_exports(__name__, {**dict.fromkeys(["x"], ".part")})\n',
    "pkg/low/lazy/part.py": "x = 1\n",
    "pkg/lazy_exports.py": "",
}
LAYERS = "# x\n\n## Layers\n\n| layer | what |\n|---|---|\n| `pkg` | root |\n| `top` | top |\n| `low`, `lazy_exports` | ground |\n"


def test_the_graph_follows_re_exports_and_lazy_names(tmp_path):
    graph = import_graph(write_package(tmp_path, LAYERED))
    assert graph["pkg.top"] == {"pkg.low.mid.impl"}  # through the re-export, to where `name` is defined
    assert graph["pkg"] == {"pkg.top"}  # the root's lazy names are its imports
    assert graph["pkg.low.lazy"] == {"pkg.lazy_exports", "pkg.low.lazy.part"}
    layers = layers_of(LAYERS)
    assert layers == {"pkg": 2, "top": 1, "low": 0, "lazy_exports": 0}
    assert arrows_up(graph, layers) == [] and package_loops(graph) == []


@pytest.mark.parametrize("planted, expected", [
    ("from ... import Driver\n", ["pkg.low.mid.impl -> pkg.top"]),  # through the root's lazy name
    ("def late():\n    from ...top import Driver\n", ["pkg.low.mid.impl -> pkg.top"]),  # in a function
    ("import pkg.top\n", ["pkg.low.mid.impl -> pkg.top"]),
])
def test_an_import_back_up_is_found_however_it_is_written(tmp_path, planted, expected):
    files = dict(LAYERED, **{"pkg/low/mid/impl.py": planted + "name = 1\n"})
    graph = import_graph(write_package(tmp_path, files))
    assert arrows_up(graph, layers_of(LAYERS)) == expected
    assert package_loops(graph) == [["low", "top"]]


def test_package_loops_finds_a_loop_within_one_layer(tmp_path):
    graph = {"pkg.a.x": {"pkg.b"}, "pkg.b": {"pkg.c.y"}, "pkg.c.y": {"pkg.a.z"}, "pkg.a.z": set(), "pkg.d": {"pkg.a.x"}}
    assert package_loops(graph) == [["a", "b", "c"]]
    assert package_loops(dict(graph, **{"pkg.c.y": set()})) == []


# -- the wings of stream/ (docs/layout.md): the surfaces on top, then planning, then reading, then the world


def stream_floor(module: str) -> int | None:
    """Where a module of `wdsprep.stream` stands: 3 the surfaces (dataset, mix, mapdataset, loader,
    slabs, the worker's pass, verify, decode, manifests, the package), 2 the planning wing, 1 the
    reading wing, 0 the world (`stream/world.py`); None outside stream/."""
    if module != "wdsprep.stream" and not module.startswith("wdsprep.stream."):
        return None
    part = module.split(".")[2] if module.count(".") >= 2 else ""
    return {"planning": 2, "reading": 1, "world": 0}.get(part, 3)


def stream_arrows_up(graph: dict[str, set[str]]) -> list[str]:
    """Every import inside stream/ that runs to a higher floor, as `importer -> imported`."""
    return sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets
                  if stream_floor(module) is not None and stream_floor(target) is not None
                  and stream_floor(target) > stream_floor(module))


def planning_reads(graph: dict[str, set[str]]) -> list[str]:
    """The planning wing's imports of the reading wing."""
    return sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets
                  if stream_floor(module) == 2 and stream_floor(target) == 1)


def test_reading_never_imports_planning_or_the_surfaces_and_planning_never_the_surfaces():
    graph = import_graph()
    assert sum(stream_floor(module) == 1 for module in graph) >= 5  # the reading wing is seen
    assert sum(stream_floor(module) == 2 for module in graph) >= 6  # and the planning wing
    assert stream_arrows_up(graph) == []


def test_planning_uses_of_reading_only_the_index_loader():
    """The sample table of shards converted before tables existed is their indexes' keys: the one
    arrow from planning into reading, to the one index loader."""
    assert planning_reads(import_graph()) == ["wdsprep.stream.planning.samples -> wdsprep.stream.reading.read"]


def test_stream_arrows_up_finds_a_planted_import_of_a_surface():
    graph = {module: set(targets) for module, targets in import_graph().items()}
    graph["wdsprep.stream.reading.access"].add("wdsprep.stream.dataset")
    graph["wdsprep.stream.world"].add("wdsprep.stream.reading.read")
    assert stream_arrows_up(graph) == ["wdsprep.stream.reading.access -> wdsprep.stream.dataset",
                                       "wdsprep.stream.world -> wdsprep.stream.reading.read"]


# -- one Range engine: the read side's threads are the read-ahead's (stream/reading/readahead.py)

THREAD_MAKERS = {"Thread", "ThreadPoolExecutor", "ProcessPoolExecutor", "ThreadPool", "Pool"}


def thread_makers(source: str) -> list[str]:
    """`line: call` for every call that makes a thread or a pool (`threading.Thread(...)`,
    `ThreadPoolExecutor(...)`, however imported or named)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in THREAD_MAKERS:
                found.append(f"{node.lineno}: {ast.unparse(node.func)}")
    return found


def test_only_the_read_ahead_makes_threads_in_the_stream():
    """Random access sends its requests by the read-ahead's engine (`readahead.Requests`): no module
    of stream/ but the read-ahead's makes a thread or a pool of its own."""
    stream = SRC / "wdsprep" / "stream"
    makers = {str(path.relative_to(stream)): thread_makers(path.read_text()) for path in sorted(stream.rglob("*.py"))}
    assert makers.pop("reading/readahead.py"), "the read-ahead's own threads are seen"
    assert {path: found for path, found in makers.items() if found} == {}


def test_thread_makers_finds_a_planted_pool():
    planted = "import concurrent.futures as cf\nfrom threading import Thread\npool = cf.ThreadPoolExecutor(4)\nThread(target=f)\n"
    assert thread_makers(planted) == ["3: cf.ThreadPoolExecutor", "4: Thread"]


# -- `wdsprep.Loader` drives `ShardDataset` through its public API only (stream/dataset.py, stream/planning/state.py)


def private_attributes(source: str) -> list[str]:
    """`line: expression` for every attribute starting with `_` read or set on anything but `self`
    (so `dataset._x`, `self.dataset._x`, `stream.position._x` are all refused; a module's private
    names are imported, never read as attributes, in the file checked)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_loader_reads_no_private_attribute_of_the_dataset():
    path = SRC / "wdsprep" / "stream" / "loader.py"
    assert private_attributes(path.read_text()) == []


def test_private_attributes_finds_a_planted_private_read_and_write():
    loader = (SRC / "wdsprep" / "stream" / "loader.py").read_text()
    planted = loader.replace("        if dataset.is_batched:\n",
                             "        dataset._resume = {}\n        if dataset._count_at is not None:\n")
    assert planted != loader
    found = private_attributes(planted)
    assert [line.split(": ", 1)[1] for line in found] == ["dataset._resume", "dataset._count_at"]
    assert private_attributes("class A:\n    def f(self):\n        return self._x, self.dataset._y\n") == [
        "3: self.dataset._y"]


# -- the layers: the conversion driver sits above the sources


def test_no_source_module_imports_the_conversion_driver():
    """A source is handed the driver (`wdsprep.Conversion`); none imports `wdsprep.conversion`, lazily or not."""
    graph = import_graph()
    sources = [module for module in graph if module == "wdsprep.sources" or module.startswith("wdsprep.sources.")]
    assert len(sources) > 20  # every source package's modules are seen
    offenders = sorted(module for module in sources if "wdsprep.conversion" in graph[module])
    assert offenders == [], f"modules under sources/ that import wdsprep.conversion: {offenders}"


# -- what converting and the command line load, measured in a fresh interpreter: only the rawnind
# acquisition (sources/rawnind/acquire/) needs httpx and trio, only reading needs torch


HEAVY = ("httpx", "trio", "torch")


def heavy_modules_after(code: str) -> list[str]:
    """Which of HEAVY a fresh interpreter holds in sys.modules after running `code`."""
    probe = f"{code}\nimport sys\nprint(' '.join(name for name in {HEAVY!r} if name in sys.modules))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=SUBPROCESS)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.mark.parametrize("source_id", BUILTIN)
def test_converting_a_source_loads_neither_httpx_trio_nor_torch(source_id):
    """What a conversion worker runs: the driver, the source's convert module, its commands' declarations."""
    code = (f"import wdsprep.conversion, wdsprep.sources.{source_id}.convert\n"
            "from wdsprep.sources.registry import load_source\n"
            f"load_source({source_id!r}).commands()")
    assert heavy_modules_after(code) == []


@pytest.mark.parametrize("argv", [["--help"], ["fetch", "rawnind", "--help"], ["serve", "dataverse", "--help"]])
def test_the_command_line_help_loads_neither_httpx_trio_nor_torch(argv):
    code = ("import contextlib, io\nfrom wdsprep.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            f"    main({argv!r})")
    assert heavy_modules_after(code) == []


def test_the_probe_sees_an_import_of_them():
    """The check itself: an interpreter that does import one of them is caught."""
    assert heavy_modules_after("import wdsprep.sources.rawnind.acquire.fetch") == ["httpx", "trio"]
