"""A script that stops iterating and exits with its iterator still open (`next(it)` then the end of
the script, a `break` out of `for s in it`) exits silently: every case in a fresh child process,
over local shards and over HTTP, through `wdsprep.dataset` (raw, decoded and batched, with and
without a shuffle buffer), `wdsprep.mix` and `wdsprep.Loader` with 0 and 2 workers. Python's own
report of a cleanup that failed at exit ("Exception ignored in: ...") goes to stderr, which must
stay empty, and the exit status must be 0."""
import pathlib
import subprocess
import sys
import textwrap

import pytest

from tests.timeouts import SUBPROCESS
from wdsprep.testing import RangeHTTPServer

from .shardsets import converted_arrays

OPENED = {
    "dataset": "it = iter(wdsprep.dataset(URL, 'train'))",
    "dataset-in-order": "it = iter(wdsprep.dataset(URL, 'train', shuffle_buffer=0, shuffle_shards=False))",
    "decoded-batched": "it = iter(wdsprep.dataset(URL, 'train', shuffle_buffer=0).compose(wdsprep.decode()).batched(3))",
    "mix": "it = iter(wdsprep.mix([wdsprep.Part(URL, weight=1, limit=12), wdsprep.Part(URL, weight=2, fraction=0.5)]))",
    "loader-0-workers": "it = iter(wdsprep.Loader(wdsprep.dataset(URL, 'train'), batch_size=2, num_workers=0))",
    "loader-2-workers": "it = iter(wdsprep.Loader(wdsprep.dataset(URL, 'train'), batch_size=2, num_workers=2))",
}
LEFT = {
    "next": "next(it)",
    "break": "for sample in it:\n    break",
}


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> pathlib.Path:
    """Generic shards of several samples each (a pass holds one open while it reads it)."""
    out = converted_arrays(tmp_path_factory.mktemp("exit-cleanup"), [f"s{i:02d}" for i in range(24)], 256,
                           "--shard-bytes", "8KB", seed=13)
    assert len(list(out.glob("*.tar"))) > 2
    return out


def _exit_with_it_open(url: str, opened: str, left: str) -> subprocess.CompletedProcess:
    script = textwrap.dedent("""
        import wdsprep
        URL = {url!r}
        {opened}
        {left}
        print("left open")
    """).format(url=url, opened=opened, left=left.replace("\n", "\n        "))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=SUBPROCESS)


@pytest.mark.parametrize("left", sorted(LEFT))
@pytest.mark.parametrize("opened", sorted(OPENED))
def test_leaving_a_local_iteration_open_exits_silently(shards, opened, left):
    result = _exit_with_it_open(str(shards), OPENED[opened], LEFT[left])
    assert (result.returncode, result.stdout, result.stderr) == (0, "left open\n", "")


@pytest.mark.parametrize("opened", ["dataset", "dataset-in-order", "decoded-batched", "loader-0-workers", "loader-2-workers"])
def test_leaving_an_http_iteration_open_exits_silently(shards, opened):
    """Over HTTP the pass also holds its read-ahead (threads, pooled connections)."""
    with RangeHTTPServer(shards) as server:
        result = _exit_with_it_open(server.url_of("manifest.json"), OPENED[opened], LEFT["next"])
    assert (result.returncode, result.stdout, result.stderr) == (0, "left open\n", "")
