"""Conversion details on tiny hand-made datasets: index order rules, dtypes, NIfTI scaling."""
import h5py
import nibabel as nib
import numpy as np

import wdsprep
from wdsprep.conversion import convert
from wdsprep.sources.deepreg import normalize, pairs

from .deepreg_testdata import samples, write_nifti


def test_nifti_scaling_is_kept_aside_and_applied_at_load(tmp_path):
    rng = np.random.default_rng(0)
    raw = rng.integers(-300, 300, size=(6, 5, 4)).astype(np.int16)
    write_nifti(tmp_path / "d/test/images/a.nii.gz", raw, slope=(2.0, 10.0))
    write_nifti(tmp_path / "d/test/images/b.nii", rng.random((6, 5, 4)).astype(np.float32))
    manifest = convert("deepreg", str(tmp_path / "d"), str(tmp_path / "out"), shard_bytes="1MB")
    first = samples(tmp_path / "out", "test")[0]
    # one dtype per split (Arrow readers need it): int16 and float32 files are both stored as float32,
    # which holds every int16 value exactly; the field table says what the files had
    assert first["image"].dtype == np.float32
    assert manifest.tables["fields"]["test"]["image.npy.zst"]["promoted_from"] == ["<f4", "<i2"]
    np.testing.assert_array_equal(first["image"], raw)  # the file's exact values
    assert first["meta"]["volumes"]["image"]["scale"] == [2.0, 10.0]
    assert first["meta"]["volumes"]["image"]["zooms"] == [0.5, 0.6000000238418579, 0.699999988079071]
    as_deepreg = np.asarray(nib.load(tmp_path / "d/test/images/a.nii.gz").dataobj, dtype=np.float32)
    np.testing.assert_array_equal(wdsprep.deepreg.to_float32(first["image"], first["meta"]["volumes"]["image"]),
                                  as_deepreg)
    out = list(pairs("unpaired", labeled=False, seed=0)(iter(samples(tmp_path / "out", "test"))))
    assert len(out) == 1
    moving = out[0]["moving_image"] if out[0]["indices"][0] == 0 else out[0]["fixed_image"]
    np.testing.assert_allclose(moving, normalize(as_deepreg), atol=1e-7)


def test_multi_dir_order_nifti_global_sort_h5_config_order(tmp_path):
    for name in ("b", "a"):
        for case in ("x", "y"):
            write_nifti(tmp_path / "n" / name / "images" / f"{case}.nii.gz", np.full((2, 2, 2), ord(name), np.uint8))
        (tmp_path / "h" / name).mkdir(parents=True)
        with h5py.File(tmp_path / "h" / name / "images.h5", "w") as handle:
            for case in ("y", "x"):
                handle[case] = np.full((2, 2, 2), ord(name), np.float32)
    for fmt, expected in (("n", ["a:x", "a:y", "b:x", "b:y"]), ("h", ["b:x", "b:y", "a:x", "a:y"])):
        base = tmp_path / fmt
        config = tmp_path / f"{fmt}.yaml"
        config.write_text(f"dataset:\n  type: unpaired\n  train:\n    dir: [{base}/b, {base}/a]\n    labeled: false\n")
        manifest = convert("deepreg", str(config), str(tmp_path / f"out-{fmt}"), shard_bytes="1MB")
        obs = manifest.tables["splits"]["train"]["obs"]
        assert [f"{d[-1]}:{n}" for _, d, n in obs] == expected
        assert [o[0] for o in obs] == [0, 1, 2, 3]


def test_grouped_h5_keys_sort_as_strings(tmp_path):
    root = tmp_path / "g" / "train"
    root.mkdir(parents=True)
    keys = ["group-1-1", "group-1-2", "group-1-10", "group-10-1", "group-10-2", "group-2-1", "group-2-2"]
    with h5py.File(root / "images.h5", "w") as handle:
        for number, key in enumerate(keys):
            handle[key] = np.full((3, 3, 3), number, np.float32)
    manifest = convert("deepreg", str(tmp_path / "g"), str(tmp_path / "out"), shard_bytes="1MB")
    table = manifest.tables["splits"]["train"]
    assert table["groups"] == [["train", "1"], ["train", "10"], ["train", "2"]]
    groups = samples(tmp_path / "out", "train")
    assert [g["meta"]["names"] for g in groups] == [["group-1-1", "group-1-10", "group-1-2"],
                                                     ["group-10-1", "group-10-2"], ["group-2-1", "group-2-2"]]
    assert groups[0]["images"][1, 0, 0, 0] == keys.index("group-1-10")  # stacked: one shape in the split
    # forward pairs follow that string order, as in DeepReg ("10" before "2")
    out = list(pairs("grouped", labeled=False, sample_image_in_group=False)(iter(groups)))
    assert len(out) == 3 + 1 + 1


def test_unlabeled_split_read_with_labeled_true_says_what_to_do(tmp_path):
    write_nifti(tmp_path / "d/test/images/a.nii.gz", np.zeros((2, 2, 2), np.uint8))
    write_nifti(tmp_path / "d/test/images/b.nii.gz", np.ones((2, 2, 2), np.uint8))
    convert("deepreg", str(tmp_path / "d"), str(tmp_path / "out"), shard_bytes="1MB")
    import pytest

    with pytest.raises(wdsprep.ConfigError, match="pass labeled=False"):
        list(pairs("unpaired")(iter(samples(tmp_path / "out", "test"))))
    out = list(pairs("unpaired", labeled=False, seed=0)(iter(samples(tmp_path / "out", "test"))))
    assert out[0]["indices"].tolist() == [0, 1, -1]
    assert not out[0]["moving_image"].any()  # constant image -> zeros (DeepReg since v0.1.0)


def test_grouped_units_hold_two_groups(tmp_path):
    root = tmp_path / "g" / "train"
    root.mkdir(parents=True)
    with h5py.File(root / "images.h5", "w") as handle:
        for g in range(1, 6):
            for t in (1, 2):
                handle[f"group-{g}-{t}"] = np.full((20, 20, 20), g, np.float32)
    manifest = convert("deepreg", str(tmp_path / "g"), str(tmp_path / "out"), shard_bytes="40KB")
    rows = manifest.shards("train")
    assert len(rows) >= 2 and all(row["samples"] >= 2 for row in rows)
    out = list(pairs("grouped", labeled=False, intra_group_prob=0, seed=0)(
        iter(samples(tmp_path / "out", "train"))))
    assert len(out) == 5 and all(s["indices"][0] != s["indices"][2] for s in out)
    one_group = [s for s in samples(tmp_path / "out", "train") if s["meta"]["group_index"] == 0]
    import pytest

    with pytest.raises(wdsprep.ConfigError, match="only one group"):
        list(pairs("grouped", labeled=False, intra_group_prob=0.5)(iter(one_group)))


def test_units_never_roll_over_so_no_pair_is_lost(tmp_path):
    """Poorly compressible volumes near the target size: pairing rules plan units above it; the
    core keeps each unit in one shard (`whole_units`), so the reader's blocks stay whole."""
    rng = np.random.default_rng(0)
    unpaired = tmp_path / "u" / "train"
    unpaired.mkdir(parents=True)
    with h5py.File(unpaired / "images.h5", "w") as handle:
        for i in range(6):
            handle[f"image{i}"] = rng.standard_normal((20, 20, 20)).astype(np.float32)
    manifest = convert("deepreg", str(tmp_path / "u"), str(tmp_path / "uo"), shard_bytes="40KB")
    rows = manifest.shards("train")
    assert all(row["name"].endswith("-00.tar") for row in rows)
    assert all(row["samples"] % 2 == 0 for row in rows)
    out = list(pairs("unpaired", labeled=False, seed=0)(iter(samples(tmp_path / "uo", "train"))))
    assert len(out) == 3  # DeepReg: floor(6 / 2)

    grouped = tmp_path / "g" / "train"
    grouped.mkdir(parents=True)
    with h5py.File(grouped / "images.h5", "w") as handle:
        for g in range(1, 6):
            for t in (1, 2):
                handle[f"group-{g}-{t}"] = rng.standard_normal((20, 20, 20)).astype(np.float32)
    manifest = convert("deepreg", str(tmp_path / "g"), str(tmp_path / "go"), shard_bytes="40KB")
    assert all(row["samples"] >= 2 for row in manifest.shards("train"))
    out = list(pairs("grouped", labeled=False, intra_group_prob=0, seed=0)(iter(samples(tmp_path / "go", "train"))))
    assert len(out) == 5 and all(s["indices"][0] != s["indices"][2] for s in out)
