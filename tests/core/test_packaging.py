"""The declared Python matches what the code needs, and CI runs what the README promises."""
import ast
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]

# Standard-library modules newer than the oldest Python anyone might declare here.
STDLIB_SINCE = {"tomllib": (3, 11), "graphlib": (3, 9), "zoneinfo": (3, 9)}


def _declared_minimum() -> tuple[int, int]:
    text = (REPO / "pyproject.toml").read_text()
    spec = re.search(r'^requires-python\s*=\s*"([^"]+)"', text, re.M).group(1)
    match = re.fullmatch(r">=\s*(\d+)\.(\d+)", spec.strip())
    assert match, f"requires-python {spec!r}: expected the form '>=3.N'"
    return int(match.group(1)), int(match.group(2))


def _python_files():
    for folder in ("src", "benchmarks", "tests"):
        yield from sorted((REPO / folder).rglob("*.py"))


def _imported_modules(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0], node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module.split(".")[0], node.lineno


def test_code_parses_and_imports_on_the_declared_minimum_python():
    minimum = _declared_minimum()
    problems = []
    files = list(_python_files())
    assert len(files) > 50
    for path in files:
        source = path.read_text()
        try:
            tree = ast.parse(source, filename=str(path), feature_version=minimum)
        except SyntaxError as error:
            problems.append(f"{path.relative_to(REPO)}:{error.lineno}: not Python {minimum}: {error.msg}")
            continue
        for module, line in _imported_modules(tree):
            needed = STDLIB_SINCE.get(module)
            if needed and needed > minimum:
                problems.append(f"{path.relative_to(REPO)}:{line}: imports {module} (Python {needed}+), requires-python allows {minimum}")
    assert not problems, "\n".join(problems)


def test_ci_runs_both_readme_commands_and_the_bench_smoke():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    for command in ("make test", "make shards"):
        assert command in readme.split("## Contents")[0], f"README's set-up block lacks {command!r}"
    order = [ci.index(f"\n{step}\n") for step in ("make test", "make shards", "make verify-shards", "make bench-smoke")]
    assert order == sorted(order)
