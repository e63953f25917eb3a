"""Every exception wdsprep defines lives in `wdsprep.errors` and is exported from `wdsprep`, and from
no other namespace; a class DeepReg raised as a ValueError is still caught as one."""
import ast
import builtins
import importlib
import importlib.util
import inspect
import pathlib

import pytest

import wdsprep
import wdsprep.errors

PACKAGE = pathlib.Path(wdsprep.__file__).parent
BUILTIN_EXCEPTIONS = {name for name, value in vars(builtins).items() if inspect.isclass(value) and issubclass(value, BaseException)}


def _base_name(node: ast.expr) -> str:
    """`ValueError` -> "ValueError", `httpx.HTTPError` -> "HTTPError", anything else -> ""."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _classes(path: pathlib.Path) -> list[tuple[str, list[str]]]:
    """(name, base names) of every class statement in a file, nested ones included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [(node.name, [_base_name(base) for base in node.bases]) for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]


def exception_classes_by_file() -> dict[str, set[str]]:
    """Classes that subclass an exception, found by reading the source: a base is an exception when
    it is a builtin one, an exception class found so far anywhere in the package, or named like one
    (`...Error`, `...Exception`) as third-party ones are. Repeated until nothing new is found."""
    classes = {str(path.relative_to(PACKAGE)): _classes(path) for path in sorted(PACKAGE.rglob("*.py"))}
    assert len(classes) > 20 and "errors.py" in classes  # the scan sees the package
    known = set(BUILTIN_EXCEPTIONS)
    found: dict[str, set[str]] = {}
    while True:
        before = sum(len(names) for names in found.values())
        for path, defined in classes.items():
            for name, bases in defined:
                if any(base in known or base.endswith(("Error", "Exception")) for base in bases):
                    found.setdefault(path, set()).add(name)
                    known.add(name)
        if sum(len(names) for names in found.values()) == before:
            return found


def test_every_exception_class_in_the_package_is_defined_in_errors_py():
    found = exception_classes_by_file()
    elsewhere = {path: sorted(names) for path, names in found.items() if path != "errors.py"}
    assert elsewhere == {}, f"exception classes defined outside wdsprep/errors.py: {elsewhere}"


def test_every_class_of_errors_py_is_exported_from_wdsprep_and_derives_from_the_base():
    in_source = {name for name, _ in _classes(PACKAGE / "errors.py")}
    at_runtime = {name for name, value in vars(wdsprep.errors).items()
                  if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == "wdsprep.errors"}
    assert in_source == at_runtime == exception_classes_by_file()["errors.py"]
    assert in_source <= set(wdsprep.__all__), sorted(in_source - set(wdsprep.__all__))
    for name in in_source:
        assert getattr(wdsprep, name) is getattr(wdsprep.errors, name)
        assert issubclass(getattr(wdsprep, name), wdsprep.WdsprepError), name


def test_the_docstring_draws_every_class_of_the_hierarchy():
    """The tree in the module docstring: one class per line, indented under its base."""
    tree = [line[4:] for line in wdsprep.errors.__doc__.splitlines() if line.startswith("    ") and line.strip()]
    drawn = {}  # class -> (depth, parent)
    parents = []
    for line in tree:
        name = line.lstrip("│├└─ ").split()[0]
        depth = (len(line) - len(line.lstrip("│├└─ "))) // 4
        parents[depth:] = [name]
        drawn[name] = parents[depth - 1] if depth else None
    classes = {name: value for name, value in vars(wdsprep.errors).items() if inspect.isclass(value) and value.__module__ == "wdsprep.errors"}
    assert set(drawn) == set(classes)
    for name, parent in drawn.items():
        assert classes[name].__bases__[0] is (classes[parent] if parent else Exception), name


# The namespaces that once re-exported a class of wdsprep.errors (deprecated, now removed).
OLD_NAMESPACES = {
    "FetchError": ["wdsprep.sources.rawnind", "wdsprep.rawnind"],
    "DeepRegSamplingError": ["wdsprep.sources.deepreg", "wdsprep.deepreg"],
    "UnitFailedError": ["wdsprep.ray_executor"],
}


@pytest.mark.parametrize("name", sorted(OLD_NAMESPACES))
def test_a_moved_class_is_offered_by_wdsprep_errors_alone(name):
    for module in OLD_NAMESPACES[name]:
        if module == "wdsprep.ray_executor":
            pytest.importorskip("ray")
        namespace = importlib.import_module(module)
        assert not hasattr(namespace, name) and name not in getattr(namespace, "__all__", ()), module
    assert importlib.util.find_spec("wdsprep.sources.rawnind.fetch") is None  # the callable-module alias is gone


def test_deepreg_sampling_errors_are_still_caught_as_value_errors():
    """DeepReg raises ValueError for these; code written against DeepReg keeps catching them."""
    from wdsprep.sources.deepreg._sampling import check_grouped_options

    with pytest.raises(ValueError, match="Mixing intra and inter groups is not supported"):
        check_grouped_options(3, 0.5, "forward", sample_image_in_group=False)
    with pytest.raises(wdsprep.WdsprepError, match="between 0 and 1"):
        check_grouped_options(3, 1.5, "forward", sample_image_in_group=True)
