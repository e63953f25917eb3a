"""Every `WDSPREP_*` setting, checked when it is used (not at import), one line when it is bad.

The variables come from the one table of docs/objectstore.md ("Settings"), which must list every
`WDSPREP_*` name the package's source reads; the rules and the values that are valid are written out
here, apart from the code: for each variable and each of `abc`, empty, `0`, `-1`, `1e3`, either one
`ConfigError` line naming the variable, the value and the rule when the dataset is made (in-process
and from the command line), or the value the table below says it means. Retries are counted at a
faulty `RangeHTTPServer`, so a value set in `os.environ` after `import wdsprep` is seen to count.
"""
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import wdsprep
from tests.timeouts import SUBPROCESS
from wdsprep import cli
from wdsprep.errors import ConfigError, ShardError
from wdsprep.testing import RangeHTTPServer

REPO = pathlib.Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "wdsprep"]
VALUES = ("abc", "", "0", "-1", "1e3")

# What each variable must be, as its error says it (the rule) ...
RULES = {
    "WDSPREP_PREFETCH_BYTES": "must be 0 (no read-ahead) or a size of at least 128KiB and at most 64GiB",
    "WDSPREP_MAX_CONNECTIONS": "must be a whole number >= 1",
    "WDSPREP_RETRIES": "must be a whole number >= 0",
    "WDSPREP_TIMEOUT": "must be a number > 0 and <= 3600",
    "WDSPREP_MIN_RATE": "must be a number >= 0 and <= 1e+11",
    "WDSPREP_RATE_WINDOW": "must be a number > 0 and <= 3600",
    "WDSPREP_SKIP_BY_READING": "must be a size >= 0 bytes and at most 64GiB",
    "WDSPREP_S3_MULTIPART_BYTES": "must be a size >= 1 bytes and at most 5GiB",
    "WDSPREP_S3_PART_BYTES": "must be a size of at least 5MiB and at most 5GiB",
    "WDSPREP_RAY_RETRIES": "must be a whole number >= 0",
    "WDSPREP_TABLE_CACHE_DIR": "must be a directory path",
}
# ... and the values of VALUES that are valid: (field, what it means), and why.
ACCEPTED = {
    ("WDSPREP_PREFETCH_BYTES", "0"): ("prefetch_bytes", 0),  # no read-ahead: each piece one sequential stream
    ("WDSPREP_RETRIES", "0"): ("retries", 0),  # one attempt, no retry
    ("WDSPREP_TIMEOUT", "1e3"): ("timeout", 1000.0),  # seconds: any positive number
    ("WDSPREP_MIN_RATE", "0"): ("min_rate", 0.0),  # no rate floor
    ("WDSPREP_MIN_RATE", "1e3"): ("min_rate", 1000.0),  # bytes/s: any number >= 0
    ("WDSPREP_RATE_WINDOW", "1e3"): ("rate_window", 1000.0),  # seconds: any positive number
    ("WDSPREP_SKIP_BY_READING", "0"): ("skip_by_reading", 0),  # every forward seek is a new Range request
    ("WDSPREP_RAY_RETRIES", "0"): ("retries", 0),  # a failed unit is not tried again on Ray
    # any non-empty text names a directory (the node-local cache of remote shard tables)
    **{("WDSPREP_TABLE_CACHE_DIR", value): ("table_cache_dir", value) for value in VALUES if value},
}
READ_VARIABLES = sorted(set(RULES) - {"WDSPREP_RAY_RETRIES"})
# Every time and size has a documented maximum (docs/objectstore.md, "Settings"): the largest value
# taken, as a variable's text, with what it means, and the smallest one above it, which is refused.
MAXIMA = {
    "WDSPREP_TIMEOUT": ("3600", ("timeout", 3600.0), "3600.5"),  # an hour per connect and per read
    "WDSPREP_RATE_WINDOW": ("3600", ("rate_window", 3600.0), "3601"),
    "WDSPREP_MIN_RATE": ("1e11", ("min_rate", 1e11), "100000000001"),  # 100 GB/s
    "WDSPREP_PREFETCH_BYTES": ("64GiB", ("prefetch_bytes", 64 * 2**30), str(64 * 2**30 + 1)),
    "WDSPREP_SKIP_BY_READING": ("64GiB", ("skip_by_reading", 64 * 2**30), str(64 * 2**30 + 1)),
    "WDSPREP_S3_MULTIPART_BYTES": ("5GiB", ("s3_multipart_bytes", 5 * 2**30), str(5 * 2**30 + 1)),  # S3's largest PUT
    "WDSPREP_S3_PART_BYTES": ("5GiB", ("s3_part_bytes", 5 * 2**30), str(5 * 2**30 + 1)),  # S3's largest part
}


def documented_variables() -> list[str]:
    """The variables of the one table (docs/objectstore.md, section "Settings")."""
    text = (REPO / "docs" / "objectstore.md").read_text()
    section = text.split("### Settings", 1)[1].split("\n### ", 1)[0]
    return re.findall(r"^\| `(WDSPREP_[A-Z0-9_]+)` \|", section, re.M)


def test_the_one_table_lists_every_variable_the_package_reads_and_no_other():
    in_source, in_testing = set(), set()
    for path in (REPO / "src" / "wdsprep").rglob("*.py"):
        found = set(re.findall(r"WDSPREP_[A-Z0-9_]+", path.read_text()))
        # the shipped test services' and suites' own variables (hang guards) are the test suite's, in docs/testing.md
        shipped_tests = {"testing", "conformance"} & set(path.relative_to(REPO / "src" / "wdsprep").parts)
        (in_testing if shipped_tests else in_source).update(found)
    testing_doc = (REPO / "docs" / "testing.md").read_text()
    assert all(name in testing_doc for name in in_testing - in_source), sorted(in_testing)
    documented = documented_variables()
    assert len(documented) == len(set(documented)), documented
    assert set(documented) == in_source == set(RULES), (sorted(documented), sorted(in_source))
    readme = (REPO / "README.md").read_text()
    assert "docs/objectstore.md#settings" in readme  # the README sends users to the table


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> pathlib.Path:
    """A few generic samples, written here as a user would, converted by the command line."""
    root = tmp_path_factory.mktemp("read-options")
    rng = np.random.default_rng(3)
    (root / "in" / "train").mkdir(parents=True)
    for i in range(6):
        np.save(root / "in" / "train" / f"s{i}.array.npy", rng.standard_normal(600).astype(np.float32))
    subprocess.run(CLI + ["convert", "generic", str(root / "in"), str(root / "out"), "--shard-bytes", "6KB", "--quiet"],
                   check=True, capture_output=True, timeout=SUBPROCESS)
    return root


def _one_line(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("value", VALUES, ids=lambda v: repr(v))
@pytest.mark.parametrize("variable", READ_VARIABLES)
def test_each_variable_is_checked_when_the_dataset_is_made(shards, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    manifest = str(shards / "out" / "manifest.json")
    if (variable, value) in ACCEPTED:
        field, meaning = ACCEPTED[variable, value]
        dataset = wdsprep.dataset(manifest, "train")
        assert getattr(dataset.read_options, field) == meaning
        assert sum(1 for _ in dataset) == 6
        return
    with pytest.raises(ConfigError) as raised:
        wdsprep.dataset(manifest, "train")
    assert _one_line(raised.value) == f"{variable}={value!r}: {RULES[variable]}" + _rest(raised.value, variable, value)


def _rest(error: BaseException, variable: str, value: str) -> str:
    """What the message says after the rule (the meaning and the default, in parentheses)."""
    head = f"{variable}={value!r}: {RULES[variable]}"
    message = str(error)
    assert message.startswith(head), message
    rest = message[len(head):]
    assert re.fullmatch(r"(, e\.g\. 64MiB)? \([^()]*default[^()]*\)", rest), rest
    return rest


def test_every_time_and_size_has_its_documented_maximum(shards, monkeypatch):
    """`WDSPREP_TIMEOUT=1e23` (and every time and size far beyond use) is one line when the dataset
    is made: each variable's documented maximum is taken, the next value above it refused, and so
    is 1e23; so are the shard cache's keyword above 1 PiB and `timeout=1e23` as a keyword."""
    manifest = str(shards / "out" / "manifest.json")
    section = (REPO / "docs" / "objectstore.md").read_text().split("### Settings", 1)[1].split("\n### ", 1)[0]
    for variable, (largest, (field, meaning), above) in MAXIMA.items():
        row = next(line for line in section.splitlines() if line.startswith(f"| `{variable}` |"))
        assert "at most" in row, row  # the table says the maximum
        monkeypatch.setenv(variable, largest)
        assert getattr(wdsprep.dataset(manifest, "train").read_options, field) == meaning
        for value in (above, "1e23"):
            monkeypatch.setenv(variable, value)
            with pytest.raises(ConfigError) as raised:
                wdsprep.dataset(manifest, "train")
            _rest(raised.value, variable, value)  # one line: the variable, the value, the rule with its maximum
            assert "\n" not in str(raised.value)
        monkeypatch.delenv(variable)
    dataset = wdsprep.dataset(manifest, "train", cache_dir=str(shards / "cache"), cache_bytes=2**50)
    assert dataset.read_options.cache_bytes == 2**50
    with pytest.raises(ConfigError, match=r"^cache_bytes=1125899906842625: must be a size >= 1 bytes and at most 1PiB, "):
        wdsprep.dataset(manifest, "train", cache_dir=str(shards / "cache"), cache_bytes=2**50 + 1)
    with pytest.raises(ConfigError, match=r"^timeout=1e\+23: must be a number > 0 and <= 3600 "):
        wdsprep.dataset(manifest, "train", timeout=1e23)


@pytest.mark.parametrize("variable", READ_VARIABLES)
def test_each_variable_is_one_line_from_the_command_line(shards, monkeypatch, capsys, variable):
    """`wdsprep inspect` of a manifest over HTTP reads with the environment's options: every value
    of the table through the CLI's own `main` (one line, rc 1, or rc 0 where it is valid), and
    `abc` in a child process (one line on stderr, no traceback)."""
    with RangeHTTPServer(shards / "out") as server:
        url = server.url_of("manifest.json")
        for value in VALUES:
            monkeypatch.setenv(variable, value)
            code = cli.main(["inspect", url])
            captured = capsys.readouterr()
            if (variable, value) in ACCEPTED:
                assert code == 0 and "6 samples" in captured.out, captured
                continue
            assert code == 1, captured
            assert captured.err.splitlines() == [f"wdsprep: error: {variable}={value!r}: {RULES[variable]}"
                                                 + _rest(ConfigError(captured.err.strip()[16:]), variable, value)]
        bad = next(value for value in ("abc", "") if (variable, value) not in ACCEPTED)  # a directory: ""
        child = subprocess.run(CLI + ["inspect", url], capture_output=True, text=True, timeout=SUBPROCESS,
                               env={**os.environ, variable: bad})
    assert child.returncode == 1
    assert len(child.stderr.splitlines()) == 1 and child.stderr.startswith(f"wdsprep: error: {variable}={bad!r}: "), child.stderr


def test_ray_retries_is_checked_when_the_executor_is_made(shards, monkeypatch):
    """WDSPREP_RAY_RETRIES is read where the Ray executor is made (before any unit runs): the same
    rule, the same one line, in-process and from `wdsprep convert --executor ray`."""
    pytest.importorskip("ray")
    from wdsprep.executors import get_executor

    for value in VALUES:
        monkeypatch.setenv("WDSPREP_RAY_RETRIES", value)
        if ("WDSPREP_RAY_RETRIES", value) in ACCEPTED:
            assert get_executor("ray", workers=1).retries == ACCEPTED["WDSPREP_RAY_RETRIES", value][1]
            continue
        with pytest.raises(ConfigError) as raised:
            get_executor("ray", workers=1)
        assert _one_line(raised.value).startswith(f"WDSPREP_RAY_RETRIES={value!r}: {RULES['WDSPREP_RAY_RETRIES']} ")
    child = subprocess.run(CLI + ["convert", "generic", str(shards / "in"), str(shards / "ray-out"), "--executor", "ray"],
                           capture_output=True, text=True, timeout=SUBPROCESS, env={**os.environ, "WDSPREP_RAY_RETRIES": "-1"})
    assert child.returncode == 1
    assert child.stderr.splitlines() == [f"wdsprep: error: WDSPREP_RAY_RETRIES='-1': {RULES['WDSPREP_RAY_RETRIES']} "
                                         "(attempts of a failed unit after its first on Ray; default 2)"], child.stderr
    assert not (shards / "ray-out").exists()


def test_bad_values_do_not_break_import_or_a_local_conversion(shards, tmp_path):
    """Every variable set to a bad value: importing wdsprep (and every module that used to read
    them) works, and so do a local conversion and its verification, which read none of them."""
    bad = {variable: "abc" for variable in RULES}
    env = {**os.environ, **bad}
    imported = subprocess.run([sys.executable, "-c", "import wdsprep, wdsprep.cli, wdsprep.storage.s3, "
                               "wdsprep.storage.http, wdsprep.stream.reading.readahead, wdsprep.stream.dataset, wdsprep.upload"],
                              capture_output=True, text=True, timeout=SUBPROCESS, env=env)
    assert imported.returncode == 0 and imported.stderr == "", imported.stderr
    out = tmp_path / "out"
    for command in (["convert", "generic", str(shards / "in"), str(out), "--shard-bytes", "6KB", "--quiet"],
                    ["verify", str(out), "--quiet"]):
        result = subprocess.run(CLI + command, capture_output=True, text=True, timeout=SUBPROCESS, env=env)
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr and "error" not in result.stderr, result.stderr


def _attempts_until_given_up(shards, monkeypatch, retries_env, **keywords) -> tuple[int, str]:
    """Read a dataset over HTTP whose first shard always answers 503 (a transient error): the
    requests the server saw for that shard, and the error's message."""
    first = sorted(p.name for p in (shards / "out").glob("*.tar"))[0]
    with RangeHTTPServer(shards / "out") as server:
        server.fail_next(first, 503, times=50)
        if retries_env is not None:
            monkeypatch.setenv("WDSPREP_RETRIES", retries_env)
        dataset = wdsprep.dataset(server.url_of("manifest.json"), "train", shuffle_shards=False, **keywords)
        with pytest.raises(ShardError) as raised:
            list(dataset)
        return len(server.requests_for(first)), str(raised.value)


def test_a_value_set_after_import_takes_effect(shards, monkeypatch):
    """`wdsprep` is imported (at the top of this module) before the variable is set: the retries
    the server counts follow the value set later, and change when it changes."""
    assert "WDSPREP_RETRIES" not in os.environ
    attempts, message = _attempts_until_given_up(shards, monkeypatch, "1")
    assert attempts == 2 and "giving up after 2 attempts" in message, (attempts, message)
    attempts, message = _attempts_until_given_up(shards, monkeypatch, "3")
    assert attempts == 4 and "giving up after 4 attempts" in message, (attempts, message)


def test_a_keyword_overrides_its_variable(shards, monkeypatch):
    """`retries=` given to the dataset wins over WDSPREP_RETRIES, even over a bad one (not read)."""
    attempts, _ = _attempts_until_given_up(shards, monkeypatch, "abc", retries=2)
    assert attempts == 3
    attempts, _ = _attempts_until_given_up(shards, monkeypatch, "4", retries=0)
    assert attempts == 1


def test_read_options_given_to_the_dataset_are_what_it_reads_with(shards, monkeypatch):
    """`read_options=wdsprep.ReadOptions(retries=2)`: the environment is not read (a bad
    WDSPREP_RETRIES included), and a keyword beside it overrides it."""
    attempts, _ = _attempts_until_given_up(shards, monkeypatch, "abc", read_options=wdsprep.ReadOptions(retries=2))
    assert attempts == 3
    attempts, _ = _attempts_until_given_up(shards, monkeypatch, "4", read_options=wdsprep.ReadOptions(retries=2),
                                           retries=0)
    assert attempts == 1


@pytest.mark.parametrize("keywords, message", [
    ({"shuffle_buffer": -1}, "shuffle_buffer=-1: must be a whole number >= 0"),
    ({"shuffle_buffer": "many"}, "shuffle_buffer='many': must be a whole number >= 0"),
    ({"seed": -1}, "seed=-1: must be a whole number >= 0"),
    ({"epoch": -2}, "epoch=-2: must be a whole number >= 0"),
    ({"world_size": 0, "rank": 0}, "world_size=0: must be a whole number >= 1"),
    ({"world_size": 2, "rank": 2}, "rank=2: must be a whole number >= 0 (below world_size=2; at most 1)"),
    ({"rank": -1, "world_size": 2}, "rank=-1: must be a whole number >= 0 (below world_size=2; at most 1)"),
    ({"prefetch_bytes": -1}, "prefetch_bytes=-1: must be 0 (no read-ahead) or a size of at least 128KiB"),
    ({"max_connections": 0}, "max_connections=0: must be a whole number >= 1"),
    ({"retries": -1}, "retries=-1: must be a whole number >= 0"),
    ({"timeout": 0}, "timeout=0: must be a number > 0"),
    ({"min_rate": -1}, "min_rate=-1: must be a number >= 0"),
    ({"rate_window": 0}, "rate_window=0: must be a number > 0"),
    ({"cache_dir": "x", "cache_bytes": 0}, "cache_bytes=0: must be a size >= 1 bytes"),
    ({"equalize": "some"}, "equalize='some': must be one of None, 'pad', 'drop'"),
])
def test_every_keyword_of_the_dataset_is_checked_with_one_line(shards, keywords, message):
    with pytest.raises(ConfigError) as raised:
        wdsprep.dataset(str(shards / "out"), "train", **keywords)
    assert _one_line(raised.value).startswith(message), str(raised.value)


def test_an_unknown_keyword_is_a_type_error(shards):
    with pytest.raises(TypeError, match="unexpected keyword argument 'retry'"):
        wdsprep.dataset(str(shards / "out"), "train", retry=3)
