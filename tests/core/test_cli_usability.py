"""The command line's own answers: `--version`, an unknown command, the help of every command (on
stdout), every command's errors in one convention (a command line it cannot take: one line, exit
status 2; a failure while it runs: one line, exit status 1), and the warning when `--shard-bytes`
makes shards of one sample.

Each runs `python -m wdsprep` in a child process, as a user does, and is judged against something
outside the code under test: pyproject.toml's version, the command list of `wdsprep --help`, the
options of each `wdsprep VERB NAME --help`, the shards counted with `tarfile`, and for errors the
rule itself (one line, `wdsprep: error:` and the command's name, the same exit status everywhere,
nothing written).
"""
import pathlib
import re
import subprocess
import sys
import tarfile
import tomllib

import numpy as np
import pytest

from tests.timeouts import SUBPROCESS
from wdsprep.conversion import convert

REPO = pathlib.Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "wdsprep"]


def _run(*argv) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + [str(arg) for arg in argv], capture_output=True, text=True, timeout=SUBPROCESS)


def test_version_is_the_installed_package_version():
    result = _run("--version")
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert (result.returncode, result.stdout, result.stderr) == (0, f"wdsprep {version}\n", "")


def _commands() -> list[str]:
    """The commands `wdsprep --help` lists on stdout: `usage: wdsprep {convert,synth,...} ...`."""
    result = _run("--help")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    match = re.match(r"usage: wdsprep \{([a-z,]+)\} \.\.\.", result.stdout)
    assert match, result.stdout
    return match.group(1).split(",")


@pytest.mark.parametrize("second", ["x", "http://host/a.tar", "s3://bucket/key.tar", "pkg.absent:SOURCE"])
def test_an_unknown_command_is_named_with_the_list_of_commands(second):
    """Whatever follows it (a URL is never taken for a plugin's name; a plugin that does not load
    is named too): one line naming the unknown command and the commands, exit status 2."""
    result = _run("nosuchcmd", second)
    commands = _commands()
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wdsprep: error: unknown command 'nosuchcmd' (commands: "), lines
    listed = re.search(r"\(commands: ([a-z, ]+);", lines[0]).group(1).split(", ")
    assert listed == commands and {"convert", "verify", "fetch", "serve"} <= set(listed)
    assert ("cannot load source plugin" in lines[0]) == (second == "pkg.absent:SOURCE"), lines  # a URL: no plugin tried
    if second == "pkg.absent:SOURCE":
        assert "cannot load source plugin 'pkg.absent:SOURCE'" in lines[0], lines


def test_no_command_is_the_usage_on_stderr_with_status_2():
    result = _run()
    assert result.returncode == 2 and result.stdout == "" and result.stderr.startswith("usage: wdsprep {")


def _listed() -> list[str]:
    """The command names of `wdsprep --help`'s rows (`  convert SOURCE INPUT OUTPUT   native ...`)."""
    rows = _run("--help").stdout.splitlines()[1:]
    return [" ".join(re.match(r"  ((?:[a-z]+(?: |$))+)", row).group(1).split()) for row in rows]


def test_the_help_lists_every_command_once_and_each_answers_its_own_help():
    """The rows name every verb of the usage line (and the command a source mounts, rawnind's
    `fetch rawnind`), each command once, and each `wdsprep NAME --help` is that command's help."""
    listed = _listed()
    assert len(listed) == len(set(listed)) and {name.split()[0] for name in listed} == set(_commands())
    assert {"convert", "pipeline", "fetch rawnind", "serve dataverse"} <= set(listed), listed
    for name in listed:
        result = _run(*name.split(), "--help")
        assert result.returncode == 0 and result.stdout.startswith(f"usage: wdsprep {name} "), (name, result.stderr)
        assert result.stderr == "", (name, result.stderr)


def test_a_source_s_help_is_on_stdout():
    result = _run("convert", "generic", "--help")
    assert (result.returncode, result.stderr) == (0, "") and result.stdout.startswith("usage: wdsprep convert generic ")


# one way to make each command fail while it runs: an input that does not exist
FAILING_RUNS = {
    "convert": ["generic", "/nonexistent/in", "{tmp}/out"],
    "synth": ["generic", "/dev/null/nonexistent/synth"],
    "inspect": ["/nonexistent/shards"],
    "verify": ["/nonexistent/shards"],
    "show": ["/nonexistent/shards", "--out", "{tmp}/report.html"],
    "pipeline": ["/nonexistent/spec.toml"],
    "upload": ["/nonexistent/shards", "{tmp}/up"],
    "reindex": ["/nonexistent/shards"],
    "index": ["/nonexistent/shards/x.tar", "--out", "{tmp}/adopted"],
    "serve dataverse": ["/nonexistent/dataverse", "--port", "0"],
    "fetch rawnind": ["{tmp}/dest", "--dry-run", "--index", "/nonexistent/i.yaml", "--listing", "/nonexistent/l.json"],
}


def _one_error_line(result: subprocess.CompletedProcess, prefix: str) -> str:
    lines = result.stderr.splitlines()
    assert result.stdout == "" and len(lines) == 1 and lines[0].startswith(prefix), result.stderr
    return lines[0]


@pytest.mark.parametrize("name", sorted(FAILING_RUNS))
def test_every_command_refuses_a_bad_argument_in_one_line_with_status_2(name):
    result = _run(*name.split(), "--no-such-option")
    _one_error_line(result, f"wdsprep: error: wdsprep {name}: ")
    assert result.returncode == 2


@pytest.mark.parametrize("name", sorted(FAILING_RUNS))
def test_every_command_fails_in_one_line_with_status_1(name, tmp_path):
    result = _run(*name.split(), *(arg.format(tmp=tmp_path) for arg in FAILING_RUNS[name]))
    line = _one_error_line(result, "wdsprep: error: ")
    assert result.returncode == 1 and "/nonexistent" in line, line


def test_every_listed_command_has_a_failing_run():
    assert sorted(_listed()) == sorted(FAILING_RUNS)


# one value each command cannot take (not an unknown option: a value of one of its arguments), and
# what the line must name
BAD_VALUES = {
    "convert": (["nosuch", "{tmp}/in", "{tmp}/out"], "unknown source 'nosuch'"),
    "synth": (["generic", "{tmp}/synth", "--seed", "-1"], "argument --seed: '-1': must be a whole number >= 0"),
    "inspect": (["{tmp}/shards", "--fraction", "2"], "fraction=2.0: must be a number > 0 and <= 1"),
    "verify": (["ftp://host/shards"], "ftp://host/shards: cannot read ftp://"),
    "show": (["{tmp}/shards", "--samples", "-1", "--out", "{tmp}/page.html"], "argument --samples: '-1'"),
    "pipeline": (["{tmp}/spec.toml", "--workers", "0"], "argument --workers: '0': must be a whole number >= 1"),
    "upload": (["{tmp}/shards", "{tmp}/up", "--part-bytes", "banana"], "argument --part-bytes: 'banana': must be a size"),
    "reindex": (["http://host/shards"], "http://host/shards: cannot write to http://"),
    "index": (["{tmp}/a.tar", "--out", "{tmp}/out", "--workers", "0"], "argument --workers: '0': must be a whole number >= 1"),
    "serve dataverse": (["{tmp}/dataverse", "--port", "70000"], "argument --port: '70000': must be a whole number >= 0 (at most 65535)"),
    "fetch rawnind": (["{tmp}/dest", "--concurrency", "0"], "argument --concurrency: '0'"),
}
# ... and the command lines the README says are bad arguments, and a few more of each kind
MORE_BAD_VALUES = [
    (["convert", "generic", "{tmp}/in", "{tmp}/out", "--shard-bytes", "banana"], "--shard-bytes: cannot read size 'banana'"),
    (["convert", "generic", "{tmp}/in", "{tmp}/out", "--workers", "0"], "--workers must be at least 1"),
    (["convert", "generic", "{tmp}/in", "ftp://host/out"], "ftp://host/out: cannot write to ftp://"),
    (["synth", "nosuch", "{tmp}/synth"], "unknown source 'nosuch'"),
    (["inspect", "{tmp}/shards", "--limit", "0"], "limit=0: must be a whole number >= 1"),
    (["inspect", "{tmp}/shards", "--select", "label =="], "select 'label ==': not an expression"),
    (["inspect", "{tmp}/shards", "--samples", "-2"], "argument --samples: '-2'"),
    (["show", "{tmp}/shards", "--fraction", "0", "--out", "{tmp}/page.html"], "fraction=0.0: must be a number > 0"),
    (["upload", "{tmp}/shards", "{tmp}/up", "--retries", "-1"], "argument --retries: '-1'"),
    (["fetch", "rawnind", "{tmp}/dest", "--max-raw-bytes", "lots"], "argument --max-raw-bytes: 'lots'"),
    (["index", "{tmp}/a.tar", "--out", "ftp://host/out"], "ftp://host/out: cannot write to ftp://"),
]


def _bad_value(argv: list[str], named: str, tmp_path: pathlib.Path, name: str) -> None:
    result = _run(*(arg.format(tmp=tmp_path) for arg in argv))
    line = _one_error_line(result, f"wdsprep: error: wdsprep {name}: ")
    assert result.returncode == 2 and named in line and line.endswith(f"(wdsprep {name} --help shows its options)"), line
    assert list(tmp_path.iterdir()) == []  # judged before any work: nothing written


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_every_command_refuses_a_value_it_cannot_take_in_one_line_with_status_2(name, tmp_path):
    argv, named = BAD_VALUES[name]
    _bad_value([*name.split(), *argv], named, tmp_path, name)


@pytest.mark.parametrize("argv, named", MORE_BAD_VALUES, ids=lambda value: value if isinstance(value, str) else " ".join(value[:2]))
def test_more_command_lines_wdsprep_cannot_take_are_one_line_with_status_2(argv, named, tmp_path):
    name = " ".join(argv[:2]) if argv[0] == "fetch" else argv[0]
    _bad_value(argv, named, tmp_path, name)


def test_every_listed_command_has_a_bad_value():
    assert sorted(_listed()) == sorted(BAD_VALUES)


def test_a_source_s_own_option_error_names_the_source():
    result = _run("convert", "generic", "in", "out", "--no-such-option")
    line = _one_error_line(result, "wdsprep: error: wdsprep convert generic: ")
    assert result.returncode == 2 and "--no-such-option" in line


def _options(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", help_text))


@pytest.mark.parametrize("verb, name", [("fetch", "rawnind"), ("serve", "dataverse")])
def test_the_help_of_a_source_command_verb_is_complete(verb, name):
    """`wdsprep VERB --help` is rc 0 and holds all of `wdsprep VERB NAME --help`: the usage, the
    summary and every option (before, one usage line and rc 2)."""
    whole = _run(verb, "--help")
    one = _run(verb, name, "--help")
    assert whole.returncode == 0 and one.returncode == 0, (whole.stderr, one.stderr)
    assert f"usage: wdsprep {verb} {name}" in whole.stdout
    assert _options(whole.stdout) == _options(one.stdout) and len(_options(one.stdout)) >= 5, whole.stdout
    summary = {"fetch": "download RawNIND from a Dataverse server", "serve": "a local Dataverse-compatible server"}[verb]
    assert summary in whole.stdout and summary in one.stdout
    if verb == "fetch":  # its exit statuses are part of its story
        assert "exit status: 0" in re.sub(r"\s+", " ", whole.stdout)


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> pathlib.Path:
    """Twelve generic samples of about 8 KB each, written as a user would."""
    root = tmp_path_factory.mktemp("one-sample") / "in"
    (root / "train").mkdir(parents=True)
    rng = np.random.default_rng(2)
    for i in range(12):
        np.save(root / "train" / f"k{i:02d}.array.npy", rng.standard_normal(2000).astype(np.float32))
    return root


def _samples_per_shard(directory: pathlib.Path) -> list[int]:
    counts = []
    for path in sorted(directory.glob("*.tar")):
        with tarfile.open(path) as archive:
            counts.append(len({m.name.split(".", 1)[0] for m in archive.getmembers() if not m.name.startswith("__")}))
    return counts


def test_one_sample_shards_are_converted_with_one_warning_line(native, tmp_path):
    """`--shard-bytes` below a sample: the shards are written and verify, each holds one sample
    (counted with tarfile), and stderr has exactly one line, a warning naming the count."""
    result = _run("convert", "generic", native, tmp_path / "tiny", "--shard-bytes", "1KB", "--codec", "none", "--quiet")
    assert result.returncode == 0, result.stderr
    counts = _samples_per_shard(tmp_path / "tiny")
    assert counts == [1] * 12
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wdsprep: warning: 12 of 12 shards hold a single sample: "
                                                   "--shard-bytes 1.0 KB is smaller than two samples"), lines
    assert _run("verify", tmp_path / "tiny", "--quiet").returncode == 0

    with pytest.warns(UserWarning, match="12 of 12 shards hold a single sample"):
        convert("generic", str(native), str(tmp_path / "api"), shard_bytes="1KB", codec="none")


def test_shards_of_one_sample_under_the_target_are_warned_about_too(tmp_path):
    """`--shard-bytes 4KB` over samples of ~1 KB (a shard of two would be over 4000 bytes with its
    index and end blocks): each shard holds one sample (tarfile counts them) and is within the
    target, yet every shard still costs a request: the one warning line says so."""
    native = tmp_path / "in"
    (native / "train").mkdir(parents=True)
    rng = np.random.default_rng(5)
    for i in range(24):
        np.save(native / "train" / f"k{i:02d}.array.npy", rng.standard_normal(200).astype(np.float32))
    result = _run("convert", "generic", native, tmp_path / "out", "--shard-bytes", "4KB", "--quiet")
    assert result.returncode == 0, result.stderr
    assert _samples_per_shard(tmp_path / "out") == [1] * 24
    assert all(path.stat().st_size <= 4000 for path in (tmp_path / "out").glob("*.tar"))  # none above the target
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wdsprep: warning: 24 of 24 shards hold a single sample: "
                                                   "--shard-bytes 4.0 KB is smaller than two samples"), lines


@pytest.mark.parametrize("shard_bytes", ["1MB", "20KB"])
def test_shards_of_several_samples_give_no_warning(native, tmp_path, shard_bytes):
    """A size holding several samples (20KB: two of 8 KB, the last shard the one-sample remainder)."""
    result = _run("convert", "generic", native, tmp_path / "out", "--shard-bytes", shard_bytes, "--codec", "none", "--quiet")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    counts = _samples_per_shard(tmp_path / "out")
    assert sum(counts) == 12 and max(counts) >= 2
