"""The selection and mix flags of the command line, on shards made by `wdsprep convert`:
`convert --index-fields`, `inspect --select/--keys/--fraction/--limit`, `show --select`, and
`inspect MIX.toml`. Expected values come from the tar files read with `tarfile` and `msgpack` here,
and from a largest-remainder apportionment written in the test."""
from __future__ import annotations

import html
import pathlib
import re
import tarfile
from fractions import Fraction

import msgpack
import pytest

from wdsprep.conformance import read_sample_table, run_cli, tar_samples


@pytest.fixture(scope="module")
def noisebase(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("cli-selection")
    assert run_cli("synth", "noisebase", root / "native", "--quiet")[0] == 0
    status, _, err = run_cli("convert", "noisebase", root / "native", root / "shards", "--quiet", "--shard-bytes", "200000")
    assert status == 0, err
    return root


def frames(shards: pathlib.Path) -> list[tuple[str, int]]:
    """(key, meta["frame"]) of every train sample in manifest order (shard names sort in that order)."""
    found = []
    for path in sorted(shards.glob("train-*.tar")):
        with tarfile.open(path) as archive:
            for key, members in tar_samples(path):
                meta = next(m for m in members if m.name.endswith(".meta.mp"))
                found.append((key, msgpack.unpackb(archive.extractfile(meta).read())["frame"]))
    return found


def test_convert_index_fields_names_the_sample_tables_fields(noisebase):
    shards = noisebase / "shards-seq"
    status, _, err = run_cli("convert", "noisebase", noisebase / "native", shards, "--quiet", "--index-fields", "meta.sequence")
    assert status == 0, err
    keys, fields = read_sample_table(shards, "train")
    assert keys == [key for key, _ in frames(shards)] and sorted(fields) == ["meta.sequence"]
    status, _, err = run_cli("convert", "noisebase", noisebase / "native", noisebase / "shards-keys", "--quiet", "--index-fields", "")
    assert status == 0 and read_sample_table(noisebase / "shards-keys", "train")[1] == {}
    status, _, err = run_cli("convert", "noisebase", noisebase / "native", noisebase / "bad", "--index-fields", "a b")
    assert status == 2 and err.count("\n") == 1 and "--index-fields" in err and not (noisebase / "bad").exists()


def test_inspect_select_counts_and_shows_the_kept_samples_in_order(noisebase):
    shards = noisebase / "shards"
    kept = [key for key, frame in frames(shards) if frame == 1]
    status, out, err = run_cli("inspect", shards, "--select", "meta.frame == 1", "--samples", "3")
    assert status == 0, err
    assert f"keeps {len(kept)} of {len(frames(shards))} samples" in out
    assert re.findall(r"^  train/(\S+):", out, re.M) == kept[:3]


def test_inspect_keys_fraction_limit(noisebase):
    shards = noisebase / "shards"
    everything = [key for key, _ in frames(shards)]
    wanted = everything[5::4]
    (noisebase / "keys.txt").write_text("\n".join(reversed(wanted)) + "\n")
    status, out, _ = run_cli("inspect", shards, "--keys", noisebase / "keys.txt", "--limit", "2", "--samples", "9")
    assert status == 0 and re.findall(r"^  train/(\S+):", out, re.M) == wanted[:2]  # manifest order, then the limit
    status, out, _ = run_cli("inspect", shards, "--fraction", "0.25", "--samples", "0")
    assert f"keeps {round(0.25 * len(everything))} of {len(everything)}" in out
    status, _, err = run_cli("inspect", shards, "--select", "meta.frame ==")
    assert status == 2 and err.startswith("wdsprep: error: wdsprep inspect: select") and err.count("\n") == 1


def test_show_select_draws_only_kept_samples(noisebase, tmp_path):
    shards = noisebase / "shards"
    kept = {key for key, frame in frames(shards) if frame == 2}
    page = tmp_path / "page.html"
    status, _, err = run_cli("show", shards, "--select", "meta.frame == 2", "--samples", "5", "--out", page, "--quiet")
    assert status == 0, err
    drawn = re.findall(r'data-key="([^"]+)"', page.read_text())
    assert len(drawn) == min(5, len(kept)) and set(drawn) <= kept
    assert "the selection keeps: select 'meta.frame == 2'" in html.unescape(page.read_text())


def largest_remainder(total: int, shares: list[Fraction]) -> list[int]:
    exact = [total * share / sum(shares) for share in shares]
    counts = [int(value) for value in exact]
    for index in sorted(range(len(shares)), key=lambda i: (-(exact[i] - counts[i]), i))[: total - sum(counts)]:
        counts[index] += 1
    return counts


def test_inspect_mix_file_lists_each_parts_share_of_the_epoch(noisebase, tmp_path):
    kept = sum(frame == 1 for _, frame in frames(noisebase / "shards"))
    mix_file = tmp_path / "mix.toml"
    mix_file.write_text(f'samples_per_epoch = 31\nshuffle_buffer = 10\n'
                        f'[[part]]\nlocation = "{noisebase / "shards"}"\nname = "all"\nweight = 0.7\n'
                        f'[[part]]\nlocation = "{noisebase / "shards"}"\nname = "f1"\nselect = "meta.frame == 1"\nweight = 0.3\n')
    status, out, err = run_cli("inspect", mix_file)
    assert status == 0, err
    rows = {line.split()[0]: line.split()[1:6] for line in out.splitlines() if line.startswith("  ") and "train" in line}
    counts = largest_remainder(31, [Fraction(7, 10), Fraction(3, 10)])
    assert rows["all"][:4] == ["train", str(len(frames(noisebase / "shards"))), "0.7", str(counts[0])]
    assert rows["f1"][:4] == ["train", str(kept), "0.3", str(counts[1])]
    assert "epoch 0: 31 samples" in out
    mix_file.write_text(mix_file.read_text().replace("weight = 0.3", "weight = -1"))
    status, _, err = run_cli("inspect", mix_file)
    assert status == 1 and err.count("\n") == 1 and str(mix_file) in err and "weight" in err
