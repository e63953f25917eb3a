"""The package's modules import each other without a cycle, counting imports inside functions too.

The graph is built from the source files' syntax trees, not by importing them: a cycle held open by a
lazy (function-level) import is a cycle all the same. An edge goes from a module to every `wdsprep`
module it names in an `import` or `from ... import` anywhere in its body; `from PKG import NAME` goes
to `PKG.NAME` when that is a module, else to `PKG`. A package's `__init__` running before its
submodules is Python's doing, not an import the code asks for, so it is not an edge.

The last tests measure what importing actually loads: a conversion (any source's convert module)
and the command line's help load neither httpx, trio nor torch, each checked in a fresh interpreter.
"""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

from tests.timeouts import SUBPROCESS
from wdsprep.sources.registry import BUILTIN

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"


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


def imports_of(module: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The package modules that `module` imports, wherever in the file the import statement is."""
    found = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            origin = _resolve(module, is_package, node.level, node.module)
            for alias in node.names:
                submodule = f"{origin}.{alias.name}"
                if submodule in known:
                    found.add(submodule)
                elif origin in known:
                    found.add(origin)
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    return {module: imports_of(module, path, known) for module, path in files.items()}


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


# -- the checker itself, on graphs and files small enough to check by eye


def test_find_cycle_finds_a_lazy_two_module_cycle(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from . import a\n")
    (package / "sub" / "a.py").write_text("from ..b import thing\n")
    (package / "b.py").write_text("def thing():\n    from .sub import a\n    return a\n")
    files = module_files(package)
    graph = {module: imports_of(module, path, set(files)) for module, path in files.items()}
    assert graph == {"pkg": set(), "pkg.sub": {"pkg.sub.a"}, "pkg.sub.a": {"pkg.b"}, "pkg.b": {"pkg.sub.a"}}
    assert find_cycle(graph) == ["pkg.b", "pkg.sub.a", "pkg.b"]


def test_find_cycle_accepts_a_diamond():
    graph = {"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}
    assert find_cycle(graph) is None
    assert find_cycle(dict(graph, d={"a"})) in (["a", "b", "d", "a"], ["a", "c", "d", "a"])


# -- `wdsprep.Loader` drives `ShardDataset` through its public API only (stream/dataset.py, stream/state.py)


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
