"""Plant each bug of `mutations.py` in a clean copy of the repo and run the tests that must catch it.

    .venv/bin/python tests/mutants/run.py                 # every mutation, a markdown kill table
    .venv/bin/python tests/mutants/run.py --list          # ids and bugs
    .venv/bin/python tests/mutants/run.py deal-by-shard-count fortran-read-as-c
    .venv/bin/python tests/mutants/run.py --check         # only: does every snippet still apply?

For each mutation: copy the working tree (tracked and untracked files, not .git/.venv/shards) to a
temporary directory, apply the edits (each `old` snippet must occur exactly once, or the entry is
reported "snippet not found" / "snippet ambiguous" and counts as a failure of this script), check
that `import wdsprep` in the copy resolves to the copy's own sources, then run pytest -x on the
mutation's test paths there. killed = the tests failed; survived = they passed. Exit status 0 only
when every mutation was killed. Not collected by pytest (no test_*.py name).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from mutations import MUTATIONS, Mutation  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
SKIP = {".git", ".venv", "shards", "bench-work", ".hypothesis", ".pytest_cache", "__pycache__", "build", "dist"}
LIMIT = float(os.environ.get("WDSPREP_MUTANT_TIMEOUT", "1800"))  # a hang guard per mutant run


class SnippetError(Exception):
    pass


def apply(mutation: Mutation, root: pathlib.Path) -> None:
    path = root / mutation.file
    if not path.is_file():
        raise SnippetError(f"{mutation.file}: file not found")
    text = path.read_text()
    for old, new in mutation.edits:
        count = text.count(old)
        if count != 1:
            what = "snippet not found" if count == 0 else f"snippet ambiguous ({count} matches)"
            raise SnippetError(f"{mutation.file}: {what}: {old.splitlines()[0].strip()!r}")
        text = text.replace(old, new)
    path.write_text(text)


def copy_tree(destination: pathlib.Path) -> pathlib.Path:
    root = destination / "repo"
    shutil.copytree(REPO, root, ignore=lambda d, names: [n for n in names if n in SKIP or n.endswith(".egg-info")],
                    symlinks=True)
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


def run_one(mutation: Mutation, keep: bool = False) -> tuple[str, str]:
    """(result, detail): killed / survived / stale / broken."""
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutation.id}-") as scratch:
        root = copy_tree(pathlib.Path(scratch))
        try:
            apply(mutation, root)
        except SnippetError as error:
            return "stale", str(error)
        if not imports_the_copy(root):
            return "broken", "the copy's tests would not import the copy's sources"
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", *mutation.tests]
        try:
            out = subprocess.run(command, cwd=root, env=environment(root), capture_output=True, text=True, timeout=LIMIT)
        except subprocess.TimeoutExpired:
            return "killed", f"hung past {LIMIT:.0f} s"
        lines = [line for line in out.stdout.splitlines() if line.strip()]
        summary = lines[-1] if lines else out.stderr.strip()[-200:]
        if out.returncode == 0:
            return "survived", summary
        if out.returncode in (1,):
            failed = next((line.split(" ", 1)[1].split(" - ")[0] for line in lines if line.startswith("FAILED ")), summary)
            return "killed", failed
        return "broken", f"pytest exit {out.returncode}: {summary}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ids", nargs="*", help="mutation ids (default: all)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--check", action="store_true", help="only check that every snippet applies")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.ids or m.id in args.ids]
    unknown = set(args.ids) - {m.id for m in MUTATIONS}
    if unknown:
        parser.error(f"unknown mutation ids: {', '.join(sorted(unknown))}")
    if args.list:
        for m in chosen:
            print(f"{m.id:32} {m.bug}")
        return 0
    if args.check:
        bad = 0
        for m in chosen:
            text_root = REPO
            try:
                source = (text_root / m.file).read_text()
                for old, _ in m.edits:
                    if source.count(old) != 1:
                        raise SnippetError(f"{m.file}: snippet {'not found' if not source.count(old) else 'ambiguous'}: {old.splitlines()[0].strip()!r}")
                print(f"ok     {m.id}")
            except (SnippetError, FileNotFoundError) as error:
                bad += 1
                print(f"STALE  {m.id}: {error}")
        return 1 if bad else 0
    print("| mutation | planted bug | tests run | result | caught by |")
    print("|---|---|---|---|---|")
    outcomes = []
    for m in chosen:
        result, detail = run_one(m)
        outcomes.append(result)
        print(f"| `{m.id}` | {m.bug} | {', '.join(m.tests)} | **{result}** | {detail.replace('|', '/')} |", flush=True)
    killed = outcomes.count("killed")
    print(f"\n{killed} of {len(outcomes)} killed")
    return 0 if killed == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
