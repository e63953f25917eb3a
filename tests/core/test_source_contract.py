"""The Source contract: the core never probes a source, the base class's defaults, the one
`--on-error` rule, the one list of built-in ids, and the source package template (same file names
for the same roles; a converter that does not import torch)."""
import argparse
import ast
import pathlib
import subprocess
import sys

import pytest

import wdsprep
from tests.timeouts import SUBPROCESS
from wdsprep.errors import ConfigError, InputError
from wdsprep.sources.base import Plan, PlanContext, Source, Unit, UnitContext
from wdsprep.sources.registry import BUILTIN, NAMESPACES, load_source

PACKAGE = pathlib.Path(wdsprep.__file__).resolve().parent
CORE = ["cli.py", "conversion.py", "executors.py", "ray_executor.py", "inputs.py", "__init__.py"]


def _calls(path: pathlib.Path, names: set[str]) -> list[ast.Call]:
    tree = ast.parse(path.read_text())
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names]


@pytest.mark.parametrize("module", CORE)
def test_the_core_never_probes_a_source(module):
    """No `hasattr(source, ...)` / `getattr(source, ..., default)`: every hook has a default on Source."""
    probes = [f"{module}:{call.lineno}: {ast.unparse(call)}" for call in _calls(PACKAGE / module, {"hasattr", "getattr"})
              if "source" in ast.unparse(call.args[0]).lower()]
    assert not probes, "\n".join(probes)


@pytest.mark.parametrize("module", CORE)
def test_the_core_names_no_source(module):
    """Built-in ids live in sources/registry.py only (the core once knew rawnind's fetch by name)."""
    tree = ast.parse((PACKAGE / module).read_text())
    named = [f"{module}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and node.value in (*BUILTIN, "dataverse")]
    assert not named, "\n".join(named)


def test_the_public_source_namespaces_come_from_the_registry():
    assert set(NAMESPACES) <= set(BUILTIN)
    assert [name for name in wdsprep.__all__ if name in BUILTIN] == list(NAMESPACES)


class Minimal(Source):
    """Only what a source must define."""

    id = "minimal"

    def plan(self, input, ctx):
        return Plan([Unit("train", 0, [input])], {})

    def inputs(self, item):
        return [item]

    def build(self, unit, ctx):
        yield from ()


def test_every_optional_hook_has_a_documented_default():
    source = Minimal()
    parser = argparse.ArgumentParser()
    before = len(parser._actions)
    source.add_arguments(parser)
    assert len(parser._actions) == before
    assert (source.whole_units, source.fingerprint) == (False, "stat")
    assert source.finalize(source.plan("x", PlanContext({})), [{"t": [1]}]) == {}
    assert source.commands() == []
    with pytest.raises(ConfigError, match="source 'minimal' cannot write synthetic data"):
        source.synth("/nowhere", 0, "small")


def test_a_source_without_plan_inputs_or_build_cannot_be_made():
    class Incomplete(Source):
        def plan(self, input, ctx):
            return Plan([], {})

    with pytest.raises(TypeError, match="build"):
        Incomplete()


@pytest.mark.parametrize("context", [PlanContext, UnitContext])
def test_skip_or_raise_is_the_one_on_error_rule(context):
    for options in ({}, {"on_error": "raise"}):  # raise is the default
        ctx = context(options)
        with pytest.raises(InputError, match=r"^a/b\.npy: truncated$"):
            ctx.skip_or_raise("a/b.npy", "truncated")
        with pytest.raises(InputError, match=r"^a/b\.npy: truncated$"):
            ctx.skip_or_raise("a/b.npy", "a/b.npy: truncated")  # a message naming the item is not prefixed twice
        with pytest.raises(InputError, match=r"^a/b\.npy: a/b\.npy\.zst is empty$"):
            ctx.skip_or_raise("a/b.npy", "a/b.npy.zst is empty")
        error = InputError("x.npy: bad header")
        with pytest.raises(InputError) as raised:
            ctx.skip_or_raise("x.npy", error)
        assert raised.value is error  # the source's own error, not a copy
        assert ctx.problems == []
    ctx = context({"on_error": "skip"})
    ctx.skip_or_raise("a/b.npy", "truncated")
    ctx.skip_or_raise("x.npy", InputError("x.npy: bad header"))
    ctx.skip_or_raise("y.npy", "y.npy: empty file")
    ctx.skip_or_raise("z.npy", InputError("archive.zip: member z.npy: corrupt"))
    assert ctx.problems == [  # the message never repeats the item
        {"item": "a/b.npy", "message": "truncated"},
        {"item": "x.npy", "message": "bad header"},
        {"item": "y.npy", "message": "empty file"},
        {"item": "z.npy", "message": "archive.zip: member z.npy: corrupt"},
    ]


@pytest.mark.parametrize("source_id", BUILTIN)
def test_every_builtin_source_is_a_source_with_its_id(source_id):
    source = load_source(source_id)
    assert isinstance(source, Source) and source.id == source_id
    assert type(source).__module__ == f"wdsprep.sources.{source_id}.convert"


ROLE_FILES = {"convert.py", "read.py", "synth.py", "native.py", "mapstyle.py", "show.py"}
OLD_ROLE_NAMES = {"_convert.py", "_read.py", "_synth.py", "_native.py", "_layout.py", "_format.py", "stage.py", "source.py"}


@pytest.mark.parametrize("source_id", BUILTIN)
def test_every_source_package_follows_the_file_template(source_id):
    files = {path.name for path in (PACKAGE / "sources" / source_id).glob("*.py")}
    assert "convert.py" in files
    assert not files & OLD_ROLE_NAMES, f"rename to one of {sorted(ROLE_FILES)} (README: Adding a source)"


@pytest.mark.parametrize("source_id", BUILTIN)
def test_a_converter_does_not_import_torch(source_id):
    """What a conversion worker imports: the driver's module and the source's converter."""
    code = ("import sys, wdsprep.conversion; from wdsprep.sources.registry import load_source; "
            f"load_source({source_id!r}); print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SUBPROCESS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
