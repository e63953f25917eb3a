"""DeepReg's default index fields (`has_label`: whether a sample holds a label, `meta.num_labels`)
against the shards read with tarfile + msgpack, and a selection on them."""
import tarfile

import msgpack

import wdsprep
from wdsprep.sources.registry import load_source
from wdsprep.conformance import read_manifest, read_sample_table, run_cli, tar_samples


def test_each_pair_is_indexed_by_its_label_presence_and_count(tmp_path):
    load_source("deepreg").synth(str(tmp_path / "in"), 0, "small")
    status, _, err = run_cli("convert", "deepreg", tmp_path / "in", tmp_path / "out", "--quiet")
    assert status == 0, err
    out = tmp_path / "out"
    counts = {}
    for split, entry in read_manifest(out)["splits"].items():
        keys, fields = read_sample_table(out, split)
        seen = []
        for row in entry["shards"]:
            with tarfile.open(out / row["name"]) as archive:
                for key, members in tar_samples(out / row["name"]):
                    names = [m.name.split(".", 1)[1] for m in members]
                    meta = next(m for m in members if m.name.endswith(".meta.mp"))
                    seen.append((key, any("label" in name for name in names),
                                 msgpack.unpackb(archive.extractfile(meta).read(), raw=False)["num_labels"]))
        assert list(zip(keys, fields["has_label"], fields["meta.num_labels"])) == seen, split
        counts[split] = seen
    split = "paired_h5_train"
    many = [key for key, _, labels in counts[split] if labels >= 2]
    assert 0 < len(many) < len(counts[split])
    got = [s["__key__"] for s in wdsprep.dataset(str(out), split, select="has_label == True and meta.num_labels >= 2",
                                                 shuffle_shards=False)]
    assert got == many
