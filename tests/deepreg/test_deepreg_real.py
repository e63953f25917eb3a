"""DeepReg's own test data: counts, values and orders that DeepReg's loaders and tests give."""
import nibabel as nib
import numpy as np
import pytest
import webdataset as wds
from scipy.ndimage import zoom

import wdsprep
from wdsprep.stream import load_manifest


def stream(manifest, split, **options):
    kind = options.pop("kind")
    urls = wdsprep.urls(str(manifest), split)
    return list(wds.WebDataset(urls, shardshuffle=False).compose(wdsprep.deepreg.pairs(kind, **options)))


def raw_samples(manifest, split):
    urls = wdsprep.urls(str(manifest), split)
    return [wdsprep.decode_sample(s) for s in wds.WebDataset(urls, shardshuffle=False)]


# --------------------------------------------------------------------------------- counts
def test_paired_train_25_pairs_per_epoch_and_58_with_all(converted):
    manifest = converted("nifti_paired")
    shapes = dict(moving_image_shape=(16, 16, 16), fixed_image_shape=(8, 8, 8))
    sampled = stream(manifest, "train", kind="paired", **shapes)
    assert len(sampled) == 25
    assert sorted(int(s["indices"][0]) for s in sampled) == list(range(25))
    every = stream(manifest, "train", kind="paired", sample_label="all", **shapes)
    assert len(every) == 58
    assert load_manifest(str(manifest)).samples("train") == 25
    streamed = stream(manifest, "train", kind="paired", shuffle=False, **shapes)  # no buffering: arrival order
    assert [int(s["indices"][0]) for s in streamed] == list(range(25))


def test_paired_test_6_samples_with_all(converted):
    samples = stream(converted("nifti_paired"), "test", kind="paired", sample_label="all", seed=0)
    assert len(samples) == 6
    assert sorted(tuple(s["indices"].tolist()) for s in samples) == [(i, k) for i in (0, 1) for k in range(3)]


def test_unpaired_train_7_pairs_from_14_images(converted):
    manifest = converted("nifti_unpaired")
    assert load_manifest(str(manifest)).samples("train") == 14
    samples = stream(manifest, "train", kind="unpaired", image_shape=(16, 16, 16))
    assert len(samples) == 7
    images = [int(i) for s in samples for i in s["indices"][:2]]
    assert sorted(images) == list(range(14))  # without replacement


def test_grouped_train_counts(converted):
    manifest = converted("nifti_grouped")
    small = dict(image_shape=(8, 8, 8), labeled=False)
    assert len(stream(manifest, "train", kind="grouped", **small)) == 2
    expected = {("forward", 1): 9, ("backward", 1): 9, ("unconstrained", 1): 18, ("forward", 0): 24}
    for (option, prob), count in expected.items():
        samples = stream(manifest, "train", kind="grouped", sample_image_in_group=False, intra_group_option=option,
                         intra_group_prob=prob, **small)
        indices = [tuple(s["indices"].tolist()) for s in samples]
        assert len(indices) == count and len(set(indices)) == count
        if prob == 1:
            assert all(i[0] == i[2] for i in indices)
            if option == "forward":
                assert all(i[1] < i[3] for i in indices)
            if option == "backward":
                assert all(i[1] > i[3] for i in indices)
        else:
            assert all(i[0] != i[2] for i in indices)


def test_grouped_test_inter_group_needs_two_groups(converted):
    manifest = converted("nifti_grouped")
    for iterated in (True, False):
        with pytest.raises(ValueError, match="There are 1 groups, we need at least two groups for inter group sampling"):
            stream(manifest, "test", kind="grouped", intra_group_prob=0.5 if iterated else 0,
                   sample_image_in_group=iterated, image_shape=(8, 8, 8))


# --------------------------------------------------------------------------------- values
def test_first_paired_test_fixed_image_statistics(converted, deepreg_data):
    sample = raw_samples(converted("nifti_paired"), "test")[0]
    assert sample["meta"]["index"] == 0 and sample["meta"]["name"] == "case000025"
    stored = sample["fixed_image"]
    assert stored.dtype == np.uint8  # lossless, original dtype
    image = wdsprep.deepreg.to_float32(stored, sample["meta"]["volumes"]["fixed_image"])
    assert image.shape == (44, 59, 41)
    assert image.max() == 255 and image.min() == 0
    assert np.isclose(np.mean(image), 68.359276, rtol=1e-6)
    assert np.isclose(np.std(image), 65.84009, rtol=1e-6)
    volume = sample["meta"]["volumes"]["fixed_image"]
    assert volume["file"] == "test/fixed_images/case000025.nii.gz"
    original = nib.load(deepreg_data / "nifti/paired/test/fixed_images/case000025.nii.gz")
    assert np.allclose(volume["zooms"], [0.4, 0.4, 0.4])
    assert np.allclose(np.array(volume["affine"]), original.affine)
    labels = sample["fixed_label"]
    assert labels.dtype == np.float64 and labels.shape == (44, 59, 41, 3)
    np.testing.assert_array_equal(labels, np.asarray(nib.load(
        deepreg_data / "nifti/paired/test/fixed_labels/case000025.nii.gz").dataobj))


def reference(path, shape, channel=None, normalise=True):
    """An independent pipeline: nibabel as DeepReg loads, min/max by hand, scipy's linear zoom."""
    array = np.asarray(nib.load(path).dataobj, dtype=np.float32).astype(np.float64)
    if channel is not None:
        array = array[..., channel]
    if normalise:
        array = (array - array.min()) / (array.max() - array.min())
    factors = [o / i for o, i in zip(shape, array.shape)]
    return zoom(array, factors, order=1, grid_mode=True, mode="nearest")


@pytest.mark.parametrize("shapes", [((16, 16, 16), (8, 8, 8)), ((70, 40, 61), (45, 20, 41))])
def test_normalised_resized_volumes_equal_scipy_reference(converted, deepreg_data, shapes):
    moving_shape, fixed_shape = shapes
    samples = stream(converted("nifti_paired"), "test", kind="paired", sample_label="all", seed=0,
                     moving_image_shape=moving_shape, fixed_image_shape=fixed_shape)
    root = deepreg_data / "nifti" / "paired" / "test"
    names = ["case000025", "case000026"]
    for sample in samples:
        index, k = (int(v) for v in sample["indices"])
        name = names[index]
        for side, shape in (("moving", moving_shape), ("fixed", fixed_shape)):
            image = reference(root / f"{side}_images" / f"{name}.nii.gz", shape)
            label = reference(root / f"{side}_labels" / f"{name}.nii.gz", shape, channel=k, normalise=False)
            assert sample[f"{side}_image"].shape == shape and sample[f"{side}_image"].dtype == np.float32
            np.testing.assert_allclose(sample[f"{side}_image"], image, atol=1e-5)
            np.testing.assert_allclose(sample[f"{side}_label"], label, atol=1e-5)


def test_unresized_sample_is_the_normalised_file(converted, deepreg_data):
    sample = stream(converted("nifti_paired"), "test", kind="paired", sample_label="all", seed=0)[0]
    name = ["case000025", "case000026"][int(sample["indices"][0])]
    array = np.asarray(nib.load(deepreg_data / "nifti/paired/test/fixed_images" / f"{name}.nii.gz").dataobj,
                       dtype=np.float32)
    expected = (array - array.min()) / (array.max() - array.min())
    np.testing.assert_allclose(sample["fixed_image"], expected, atol=1e-6)
    assert sample["fixed_image"].min() == 0 and sample["fixed_image"].max() == 1


def test_label_sampling_takes_the_same_channel_for_moving_and_fixed(converted):
    manifest = converted("nifti_paired")
    raw = {s["meta"]["index"]: s for s in raw_samples(manifest, "test")}
    for epoch in range(3):
        for sample in stream(manifest, "test", kind="paired", epoch=epoch):
            index, k = (int(v) for v in sample["indices"])
            np.testing.assert_array_equal(sample["moving_label"], raw[index]["moving_label"][..., k].astype(np.float32))
            np.testing.assert_array_equal(sample["fixed_label"], raw[index]["fixed_label"][..., k].astype(np.float32))


# --------------------------------------------------------------------------------- DeepReg's orders
def test_single_shard_split_with_seed_reproduces_deepreg_orders(converted):
    """Reference orders of DeepReg's generators with seed=0 (research notes, section 3)."""
    paired = stream(converted("nifti_paired_unlabeled"), "train", kind="paired", seed=0, labeled=False,
                    moving_image_shape=(4, 4, 4), fixed_image_shape=(4, 4, 4))
    assert [int(s["indices"][0]) for s in paired] == [14, 0, 23, 18, 6, 5, 7, 10, 22, 20, 4, 2, 21, 3, 17, 11, 19,
                                                      9, 24, 15, 16, 8, 1, 13, 12]
    assert all(s["indices"][-1] == -1 for s in paired)
    unpaired = stream(converted("nifti_unpaired_unlabeled"), "train", kind="unpaired", seed=0, labeled=False,
                      image_shape=(4, 4, 4))
    assert [tuple(int(v) for v in s["indices"][:2]) for s in unpaired] == [
        (1, 10), (9, 5), (11, 2), (3, 7), (8, 4), (0, 12), (6, 13)]
    grouped = stream(converted("nifti_grouped_unlabeled"), "train", kind="grouped", seed=0, labeled=False,
                     image_shape=(4, 4, 4))
    assert [tuple(int(v) for v in s["indices"][:4]) for s in grouped] == [(0, 0, 0, 3), (1, 1, 1, 2)]


def test_seed_none_changes_with_epoch_and_fixed_seed_does_not(converted):
    manifest = converted("nifti_paired_unlabeled")
    small = dict(kind="paired", labeled=False, moving_image_shape=(2, 2, 2), fixed_image_shape=(2, 2, 2))

    def order(**options):
        return [int(s["indices"][0]) for s in stream(manifest, "train", **small, **options)]

    assert order(epoch=0) != order(epoch=1)
    assert order(epoch=1) == order(epoch=1)
    assert order(seed=0, epoch=0) == order(seed=0, epoch=5)
    assert order(seed=0) != order(seed=1)


def test_converted_tables_keep_deepreg_indices(converted):
    tables = load_manifest(str(converted("nifti_grouped"))).tables["splits"]
    assert tables["train"]["group_struct"] == [[0, 1, 2, 3], [4, 5, 6]]
    assert tables["train"]["groups"] == [["train", "group1"], ["train", "group2"]]
    assert [o[2] for o in tables["train"]["obs"]][:4] == [f"group1/case0000{i:02d}" for i in (0, 1, 3, 8)]
    assert tables["test"]["group_struct"] == [[0, 1]]


def test_multi_dir_grouped_sorts_like_deepreg(deepreg_data, tmp_path):
    from wdsprep.conversion import convert

    root = deepreg_data / "nifti" / "grouped"
    config = tmp_path / "config.yaml"
    config.write_text(f"dataset:\n  type: grouped\n  train:\n    dir: [{root}/train, {root}/test]\n"
                      f"    format: nifti\n    labeled: false\n")
    manifest = convert("deepreg", str(config), str(tmp_path / "out"), shard_bytes="256MB")
    table = manifest.tables["splits"]["train"]
    assert table["group_struct"] == [[0, 1], [2, 3, 4, 5], [6, 7, 8]]  # DeepReg's test_nifti_loader
    samples = stream(tmp_path / "out" / "manifest.json", "train", kind="grouped", sample_image_in_group=False,
                     intra_group_prob=0, labeled=False, image_shape=(2, 2, 2))
    assert len(samples) == 9 * 8 - (2 * 1 + 4 * 3 + 3 * 2)


# --------------------------------------------------------------------------------- NIfTI == H5
def group_volume(sample: dict, role: str, position: int) -> np.ndarray:
    """Volume `position` of a grouped sample, undone as docs/deepreg.md says: `<role>s` stacked on a
    first axis, or (one dimension) the volumes raveled and concatenated, shapes in meta.volumes."""
    group = sample[role + "s"]
    if group.ndim > 1:
        return group[position]
    shapes = [volume[role]["shape"] for volume in sample["meta"]["volumes"]]
    offsets = np.cumsum([0] + [int(np.prod(shape)) for shape in shapes])
    return group[offsets[position]:offsets[position + 1]].reshape(shapes[position])


def _by_name(manifest, split):
    out = {}
    for sample in raw_samples(manifest, split):
        meta = sample["meta"]
        names = meta["names"] if meta["type"] == "grouped" else [meta["name"]]
        for position, name in enumerate(names):
            key = name.split("/")[-1].replace(".nii.gz", "")
            if meta["type"] == "grouped":
                out[key] = {"image": group_volume(sample, "image", position)}
            else:
                out[key] = {f: sample[f] for f in sample if not f.startswith("__") and f != "meta"}
    return out


def test_nifti_and_h5_hold_the_same_arrays(converted):
    group_names = {"group-1-1": "case000026", "group-1-2": "case000025"}  # DeepReg's grouped/test H5
    pairs_ = [
        ("nifti_paired", "test", "h5_paired_test", "test"),
        ("nifti_paired", "train", "h5_paired_unlabeled", "train"),
        ("nifti_unpaired", "train", "h5_unpaired", "train"),
        ("nifti_unpaired", "test", "h5_unpaired", "test"),
        ("nifti_grouped", "test", "h5_grouped_test", "test"),
    ]
    for nifti_name, nifti_split, h5_name, h5_split in pairs_:
        nifti = _by_name(converted(nifti_name), nifti_split)
        h5 = _by_name(converted(h5_name), h5_split)
        assert h5
        for name, fields in h5.items():
            twin = nifti[group_names.get(name, name)]
            for field, array in fields.items():
                assert array.dtype == np.float32
                np.testing.assert_array_equal(array, twin[field].astype(np.float32), err_msg=f"{h5_name} {name} {field}")


def test_nifti_and_h5_give_equal_training_samples(converted):
    options = dict(kind="paired", sample_label="all", seed=0, moving_image_shape=(20, 18, 16),
                   fixed_image_shape=(10, 12, 14))
    nifti = [s for s in stream(converted("nifti_paired"), "test", **options) if s["indices"][0] == 0]
    h5 = stream(converted("h5_paired_test"), "test", **options)
    assert len(nifti) == len(h5) == 3
    for a, b in zip(nifti, h5):
        assert a.keys() == b.keys()
        for field in a:
            if field != "__key__":
                np.testing.assert_array_equal(a[field], b[field])
    unpaired = dict(kind="unpaired", seed=0, labeled=False, image_shape=(16, 16, 16))
    a = stream(converted("nifti_unpaired_unlabeled"), "test", **unpaired)
    b = stream(converted("h5_unpaired"), "test", **unpaired)
    assert len(a) == len(b) == 1
    for field in ("moving_image", "fixed_image", "indices"):
        np.testing.assert_array_equal(a[0][field], b[0][field])


def test_collate_stacks_batches(converted):
    samples = stream(converted("nifti_paired"), "test", kind="paired", sample_label="all", seed=0,
                     moving_image_shape=(16, 16, 16), fixed_image_shape=(8, 8, 8))
    batch = wdsprep.deepreg.collate(samples[:4])
    assert tuple(batch["moving_image"].shape) == (4, 16, 16, 16)
    assert tuple(batch["fixed_label"].shape) == (4, 8, 8, 8)
    assert tuple(batch["indices"].shape) == (4, 2)
    assert str(batch["moving_image"].dtype) == "torch.float32"
    assert batch["__key__"] == [s["__key__"] for s in samples[:4]]


def test_grouped_mixed_sampling_with_all_labels(converted):
    manifest = converted("nifti_grouped")
    seen_inter = seen_intra = False
    for epoch in range(6):
        samples = stream(manifest, "train", kind="grouped", intra_group_prob=0.5, sample_label="all", epoch=epoch,
                         image_shape=(8, 8, 8))
        assert len(samples) == 2 * 3  # one pair per group, three labels each
        for sample in samples:
            g1, i1, g2, i2, k = (int(v) for v in sample["indices"])
            seen_inter |= g1 != g2
            seen_intra |= g1 == g2
            assert i1 < (4, 3)[g1] and i2 < (4, 3)[g2] and 0 <= k < 3
            assert sample["moving_label"].shape == (8, 8, 8)
    assert seen_inter and seen_intra
