"""RawNIND's default index fields (`meta.cfa`, `iso_min`, `iso_max`) against the synthetic data's own
record of each capture's ISO (`synth_truth.json`) and the tiles' metadata read with tarfile + msgpack,
and a selection on them."""
import shutil
import tarfile

import msgpack
import pytest

import wdsprep
from wdsprep.conformance import read_manifest, read_sample_table, run_cli, tar_samples

from .rawnind_testdata import truth


def test_each_tile_is_indexed_by_its_cfa_and_the_iso_range_of_its_noisy_captures(synth_tiny, tmp_path):
    native, out = tmp_path / "native", tmp_path / "out"
    shutil.copytree(synth_tiny, native)
    status, _, err = run_cli("convert", "rawnind", native, out, "--quiet")
    assert status == 0, err
    iso_of = {name: capture["iso"] for scene in truth(native)["scenes"].values() for name, capture in scene["noisy"].items()}
    ranges = {}
    for split, entry in read_manifest(out)["splits"].items():
        keys, fields = read_sample_table(out, split)
        metas = {}
        for row in entry["shards"]:
            with tarfile.open(out / row["name"]) as archive:
                for key, members in tar_samples(out / row["name"]):
                    meta = next(m for m in members if m.name.endswith(".meta.mp"))
                    metas[key] = msgpack.unpackb(archive.extractfile(meta).read(), raw=False)
        assert keys == list(metas)
        for i, key in enumerate(keys):
            isos = [iso_of[name] for name in metas[key]["noisy_files"]]
            assert (fields["meta.cfa"][i], fields["iso_min"][i], fields["iso_max"][i]) == (metas[key]["cfa"], min(isos), max(isos))
            ranges[key] = (min(isos), max(isos))
    low = [key for key in read_sample_table(out, "train")[0] if ranges[key][0] < 1000]
    assert low  # the case keeps something
    got = [s["__key__"] for s in wdsprep.dataset(str(out), "train", select="iso_min < 1000 and meta.cfa == 'Bayer'",
                                                 shuffle_shards=False)]
    assert got == low
    if not [key for key in read_sample_table(out, "test")[0] if ranges[key][0] < 1000]:
        with pytest.raises(wdsprep.ConfigError, match="keeps no sample of split 'test'"):
            wdsprep.dataset(str(out), "test", select="iso_min < 1000")
