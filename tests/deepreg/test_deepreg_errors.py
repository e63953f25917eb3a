"""DeepReg's construction-time checks, each triggered by a small broken copy of its test data."""
import shutil

import h5py
import nibabel as nib
import numpy as np
import pytest

from wdsprep.conversion import convert
from wdsprep.errors import ConfigError, InputError


def clone(source, target):
    """A writable copy of read-only shared data."""
    shutil.copytree(source, target)
    for path in [target, *target.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


def run(input_path, tmp_path, **options):
    return convert("deepreg", str(input_path), str(tmp_path / "out"), shard_bytes="256MB", **options)


def test_label_name_mismatch(deepreg_data, tmp_path):
    root = tmp_path / "set"
    clone(deepreg_data / "nifti/unpaired/test", root / "test")
    (root / "test/labels/case000026.nii.gz").rename(root / "test/labels/case000099.nii.gz")
    with pytest.raises(InputError, match=r"images and labels are not identical") as error:
        run(root, tmp_path)
    assert "labels/" in str(error.value) and "case000099" in str(error.value) and "case000026" in str(error.value)


def test_moving_and_fixed_image_names_must_match(deepreg_data, tmp_path):
    root = tmp_path / "set"
    clone(deepreg_data / "nifti/paired/test", root / "test")
    (root / "test/fixed_images/case000026.nii.gz").rename(root / "test/fixed_images/case000027.nii.gz")
    with pytest.raises(InputError, match="moving images and fixed images are not identical"):
        run(root, tmp_path, deepreg_labeled="false")


def test_label_count_mismatch_between_moving_and_fixed(deepreg_data, tmp_path):
    root = tmp_path / "set"
    clone(deepreg_data / "nifti/paired/test", root / "test")
    path = root / "test/fixed_labels/case000025.nii.gz"
    label = nib.load(path)
    nib.save(nib.Nifti1Image(np.asarray(label.dataobj)[..., :2], label.affine), path)
    with pytest.raises(InputError, match=r"different numbers of labels. moving: 3, fixed: 2") as error:
        run(root, tmp_path)
    assert "fixed_labels/case000025.nii.gz" in str(error.value)


def test_bad_grouped_h5_key(deepreg_data, tmp_path):
    root = tmp_path / "set" / "test"
    root.mkdir(parents=True)
    shutil.copy(deepreg_data / "h5/grouped/test/images.h5", root / "images.h5")
    with h5py.File(root / "images.h5", "a") as handle:
        handle["case-7"] = handle["group-1-1"][()]
    with pytest.raises(InputError, match=r"h5_file keys must be of form group-X-Y, got 'case-7'") as error:
        run(root.parent, tmp_path, deepreg_type="grouped")
    assert "images.h5" in str(error.value)


def test_empty_group(deepreg_data, tmp_path):
    root = tmp_path / "set"
    clone(deepreg_data / "nifti/grouped/test", root / "test")
    (root / "test/images/group2").mkdir()
    (root / "test/labels/group2").mkdir()
    with pytest.raises(InputError, match="is empty") as error:
        run(root, tmp_path)
    assert "images/group2" in str(error.value)


def test_non_3d_image(deepreg_data, tmp_path):
    root = tmp_path / "set"
    clone(deepreg_data / "nifti/unpaired/test", root / "test")
    path = root / "test/images/case000025.nii.gz"
    image = nib.load(path)
    nib.save(nib.Nifti1Image(np.asarray(image.dataobj)[:, :, 0], image.affine), path)
    with pytest.raises(InputError, match="shape should be 3D and non-empty") as error:
        run(root, tmp_path)
    assert "images/case000025.nii.gz" in str(error.value)


def test_label_values_outside_unit_interval(deepreg_data, tmp_path):
    root = tmp_path / "set"
    clone(deepreg_data / "nifti/unpaired/test", root / "test")
    path = root / "test/labels/case000026.nii.gz"
    label = nib.load(path)
    nib.save(nib.Nifti1Image(np.asarray(label.dataobj) * 2, label.affine), path)
    with pytest.raises(Exception, match=r"label values are not between \[0, 1\]") as error:
        run(root, tmp_path)
    assert "labels/case000026.nii.gz" in str(error.value)
    # skip mode leaves the bad image out and records why
    manifest = convert("deepreg", str(root), str(tmp_path / "skip"), shard_bytes="256MB", on_error="skip")
    assert manifest.samples("test") == 1
    assert "case000026" in manifest.problems[0]["message"]


def test_missing_label_folder_when_labeled(deepreg_data, tmp_path):
    root = tmp_path / "set"
    clone(deepreg_data / "nifti/unpaired/test", root / "test")
    shutil.rmtree(root / "test/labels")
    with pytest.raises(InputError, match="labels: directory does not exist"):
        run(root, tmp_path, deepreg_labeled="true")
    assert run(root, tmp_path).samples("test") == 2  # detected as unlabeled


def test_missing_h5_label_file(deepreg_data, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset:\n  type: paired\n  train:\n    dir: {deepreg_data}/h5/paired/train\n"
                      f"    format: h5\n    labeled: true\n")
    with pytest.raises(InputError, match=r"moving_labels.h5: h5 file does not exist"):
        run(config, tmp_path)


def test_no_data_and_repeated_dirs_and_bad_config(deepreg_data, tmp_path):
    (tmp_path / "empty/test/images").mkdir(parents=True)
    with pytest.raises(InputError, match="No data collected"):
        run(tmp_path / "empty", tmp_path, deepreg_type="unpaired", deepreg_labeled="false")
    root = deepreg_data / "nifti/unpaired/test"
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset:\n  type: unpaired\n  test:\n    dir: [{root}, {root}]\n    format: nifti\n")
    with pytest.raises(InputError, match="dir_paths have repeated elements"):
        run(config, tmp_path)
    config.write_text(f"dataset:\n  type: unpaired\n  example:\n    dir: {root}\n")
    with pytest.raises(ConfigError, match=r"split must be one of \['train', 'valid', 'test'\]"):
        run(config, tmp_path)
    config.write_text(f"dataset:\n  type: unpaired\n  test:\n    dir: {tmp_path}/nowhere\n")
    with pytest.raises(InputError, match="is not a directory or does not exist"):
        run(config, tmp_path)
    config.write_text(f"dataset:\n  type: sideways\n  test:\n    dir: {root}\n")
    with pytest.raises(ConfigError, match="type must be one of"):
        run(config, tmp_path)
