"""Plant each bug of `mutations.py` in a clean copy of the repo and run the tests that must catch it.

    .venv/bin/python tests/mutants/run.py                 # every mutation, a markdown kill table
    .venv/bin/python tests/mutants/run.py --list          # ids and bugs
    .venv/bin/python tests/mutants/run.py --table         # a markdown table of the entries; runs nothing
    .venv/bin/python tests/mutants/run.py deal-by-shard-count fortran-read-as-c
    .venv/bin/python tests/mutants/run.py --check         # only: does every snippet still apply?
    WDSPREP_MUTANT_REPO=/other/tree .venv/bin/python tests/mutants/run.py   # mutate another checkout

For each mutation: copy the working tree (tracked and untracked files, not .git/.venv/shards) to a
temporary directory, apply the edits (each `old` snippet must occur exactly once, or the entry is
reported "snippet not found" / "snippet ambiguous" and counts as a failure of this script), check
that `import wdsprep` in the copy resolves to the copy's own sources, then run pytest -x on the
mutation's test paths there. Tests that already fail on the clean tree (one baseline run over every
test path the chosen mutations use) are deselected, so a kill always comes from a test that passes without the bug.
killed = the tests failed; survived = they passed. Exit status 0 only
when every mutation was killed. Not collected by pytest (no test_*.py name).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from mutations import MUTATIONS, Mutation  # noqa: E402

REPO = pathlib.Path(os.environ.get("WDSPREP_MUTANT_REPO") or pathlib.Path(__file__).resolve().parents[2])
SKIP_TOP = {".git", ".venv", "shards", "bench-work", "build", "dist"}  # at the top of the repo only
SKIP = {".hypothesis", ".pytest_cache", "__pycache__"}  # anywhere
LIMIT = float(os.environ.get("WDSPREP_MUTANT_TIMEOUT", "1800"))  # a hang guard per mutant run


class SnippetError(Exception):
    pass


def choose(mutation: Mutation, root: pathlib.Path):
    """The first variant whose snippets all occur exactly once in `root` (SnippetError if none)."""
    problems = []
    for variant in mutation.variants:
        path = root / variant.file
        if not path.is_file():
            problems.append(f"[{variant.label}] {variant.file}: file not found")
            continue
        text = path.read_text()
        counts = [text.count(old) for old, _ in variant.edits]
        if counts == [1] * len(counts):
            return variant
        old = variant.edits[next(i for i, c in enumerate(counts) if c != 1)][0]
        what = "snippet not found" if 0 in counts else "snippet ambiguous"
        problems.append(f"[{variant.label}] {variant.file}: {what}: {old.splitlines()[0].strip()!r}")
    raise SnippetError("; ".join(problems))


def apply(mutation: Mutation, root: pathlib.Path):
    variant = choose(mutation, root)
    path = root / variant.file
    text = path.read_text()
    for old, new in variant.edits:
        text = text.replace(old, new)
    path.write_text(text)
    return variant


def copy_tree(destination: pathlib.Path) -> pathlib.Path:
    root = destination / "repo"
    def ignore(directory, names):
        top = pathlib.Path(directory) == REPO
        return [n for n in names if n in SKIP or (top and n in SKIP_TOP) or n.endswith(".egg-info")]

    shutil.copytree(REPO, root, ignore=ignore, symlinks=True)
    return root


def environment(root: pathlib.Path) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTEST_ADDOPTS", None)
    return env


def imports_the_copy(root: pathlib.Path) -> bool:
    out = subprocess.run([sys.executable, "-c", "import wdsprep; print(wdsprep.__file__)"], cwd=root,
                         env=environment(root), capture_output=True, text=True, timeout=300)
    return out.stdout.strip().startswith(str(root / "src"))


def _default_sigint() -> None:
    """In the pytest child: Ctrl-C as a terminal has it. A runner started in the background of a
    non-interactive shell inherits SIGINT ignored, and the Ctrl-C tests then wait out their guards."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def pytest(root: pathlib.Path, paths, extra=()) -> tuple[int, list[str], str]:
    command = [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "--no-header", *extra, *paths]
    try:
        out = subprocess.run(command, cwd=root, env=environment(root), capture_output=True, text=True, timeout=LIMIT,
                             preexec_fn=_default_sigint)
    except subprocess.TimeoutExpired:
        return -1, [], f"hung past {LIMIT:.0f} s"
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    failed = [line.split(" ", 1)[1].split(" - ")[0] for line in lines if line.startswith("FAILED ")]
    return out.returncode, failed, (lines[-1] if lines else out.stderr.strip()[-300:])


def covering(paths) -> list[str]:
    """The paths once each, without those a listed folder or file already holds (`a/b.py::t` under `a/b.py`, `a/b.py` under `a`)."""
    paths = list(dict.fromkeys(paths))
    def inside(path, other):
        return path != other and (path.startswith(other + "::") or path.startswith(other.rstrip("/") + "/"))
    return [p for p in paths if not any(inside(p, other) for other in paths)]


def baseline(paths) -> list[str]:
    """Tests failing on the clean tree: they prove nothing about a mutant, so they are deselected."""
    with tempfile.TemporaryDirectory(prefix="mutant-baseline-") as scratch:
        root = copy_tree(pathlib.Path(scratch))
        code, failed, summary = pytest(root, paths)
        if code not in (0, 1):
            raise SystemExit(f"baseline run of {' '.join(paths)} did not complete: {summary}")
        return failed


def run_one(mutation: Mutation, deselect=()) -> tuple[str, str, str]:
    """(result, variant, detail); result is killed / survived / stale / broken."""
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutation.id}-") as scratch:
        root = copy_tree(pathlib.Path(scratch))
        try:
            variant = apply(mutation, root)
        except SnippetError as error:
            return "stale", "-", str(error)
        if not imports_the_copy(root):
            return "broken", variant.label, "the copy's tests would not import the copy's sources"
        extra = ["-x", *(f"--deselect={node}" for node in deselect)]
        code, failed, summary = pytest(root, mutation.tests, extra)
        if code == -1:
            return "killed", variant.label, summary
        if code == 0:
            return "survived", variant.label, summary
        if code == 1:
            return "killed", variant.label, failed[0] if failed else summary
        return "broken", variant.label, f"pytest exit {code}: {summary}"


def table(mutations) -> str:
    """The entries as markdown: the file is the one of the variant that applies here, or marked stale."""
    rows = ["| id | planted bug | file | tests run |", "|---|---|---|---|"]
    for m in mutations:
        try:
            file = f"`{choose(m, REPO).file}`"
        except SnippetError:
            file = f"`{m.file}` (**stale**: no variant applies)"
        tests = ", ".join(f"`{path}`" for path in m.tests)
        rows.append(f"| `{m.id}` | {m.bug.replace('|', '/')} | {file} | {tests} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ids", nargs="*", help="mutation ids (default: all)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--check", action="store_true", help="only check that every snippet applies")
    parser.add_argument("--table", action="store_true",
                        help="print the entries as a markdown table (id, bug, file, tests), the file of the variant "
                             "that applies to this tree; runs nothing (docs/testing.md is generated from it)")
    parser.add_argument("--tests", nargs="+", help="run these test paths instead of each entry's own (e.g. one oracle file)")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.ids or m.id in args.ids]
    if args.tests:
        chosen = [dataclasses.replace(m, tests=tuple(args.tests)) for m in chosen]
    unknown = set(args.ids) - {m.id for m in MUTATIONS}
    if unknown:
        parser.error(f"unknown mutation ids: {', '.join(sorted(unknown))}")
    if args.list:
        for m in chosen:
            print(f"{m.id:32} {m.bug}")
        return 0
    if args.table:
        print(table(chosen))
        return 0
    if args.check:
        bad = 0
        for m in chosen:
            try:
                print(f"ok     {m.id} [{choose(m, REPO).label}]")
            except SnippetError as error:
                bad += 1
                print(f"STALE  {m.id}: {error}")
        return 1 if bad else 0
    known_failures = baseline(covering([path for m in chosen for path in m.tests]))  # one run of every path used
    if known_failures:
        print(f"baseline: {len(known_failures)} test(s) fail on the clean tree and are deselected: "
              f"{', '.join(known_failures)}\n", flush=True)
    print("| mutation | planted bug | code | tests run | result | caught by |")
    print("|---|---|---|---|---|---|")
    outcomes = []
    for m in chosen:
        result, label, detail = run_one(m, known_failures)
        outcomes.append(result)
        print(f"| `{m.id}` | {m.bug} | {label} | {', '.join(m.tests)} | **{result}** | {detail.replace('|', '/')} |", flush=True)
    killed = outcomes.count("killed")
    print(f"\n{killed} of {len(outcomes)} killed")
    return 0 if killed == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
