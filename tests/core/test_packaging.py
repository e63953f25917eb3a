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


# ------------------------------------------------------------------------- links between the documents
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _headings_and_links(path: pathlib.Path):
    """The anchors of `path`'s headings (GitHub's rule) and its links, fenced code left out."""
    anchors, links, fenced = set(), [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if heading:
            anchors.add(re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-"))
        links += [(number, target) for target in LINK.findall(line)]
    return anchors, links


def broken_links(documents, root=REPO) -> list[str]:
    """Every relative link of `documents` whose file (or heading anchor in it) does not exist."""
    problems = []
    for document in documents:
        for number, target in _headings_and_links(document)[1]:
            if re.match(r"[a-z]+:", target):  # https://, mailto: ...
                continue
            name, _, anchor = target.partition("#")
            path = (document.parent / name).resolve() if name else document
            where = f"{document.relative_to(root)}:{number}: {target}"
            if not path.exists():
                problems.append(f"{where}: no such file")
            elif anchor and path.suffix == ".md" and anchor not in _headings_and_links(path)[0]:
                problems.append(f"{where}: no heading with that anchor")
    return problems


def _documents():
    return [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]


def test_every_relative_link_in_the_documents_resolves():
    documents = _documents()
    assert len(documents) > 10
    assert not broken_links(documents), "\n".join(broken_links(documents))


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# The shard format `wdsprep/2`\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](docs/b.md#the-shard-format-wdsprep2) [file](docs/c.md) [anchor](docs/b.md#nope)\n"
                    "```\n[in code](nowhere.md)\n```\n[web](https://example.org/x.md)\n")
    assert broken_links([page], root=tmp_path) == ["a.md:1: docs/c.md: no such file",
                                                   "a.md:1: docs/b.md#nope: no heading with that anchor"]


def test_the_planted_bugs_table_in_docs_testing_lists_every_entry_of_mutations_py():
    """docs/testing.md's table is `tests/mutants/run.py --table`: one row per entry, in order, with its bug,
    one of its variants' files and its tests. The file column is not recomputed here: that reads the
    sources, which a planted bug changes, and this test must not be what kills a mutant."""
    from tests.mutants.mutations import MUTATIONS

    page = (REPO / "docs" / "testing.md").read_text()
    start = page.index("| id | planted bug |")
    rows = [row.strip("| ").split(" | ") for row in page[start:].split("\n\n")[0].strip().splitlines()[2:]]
    assert len(MUTATIONS) > 20
    assert [row[0] for row in rows] == [f"`{m.id}`" for m in MUTATIONS], "regenerate: tests/mutants/run.py --table"
    for row, m in zip(rows, MUTATIONS):
        assert row[1] == m.bug.replace("|", "/"), f"{m.id}: regenerate the table (tests/mutants/run.py --table)"
        assert row[2].split("`")[1] in {variant.file for variant in m.variants}, m.id
        assert row[3] == ", ".join(f"`{path}`" for path in m.tests), m.id
