"""Shared fixtures: DeepReg's real test data converted once per session (skipped when absent)."""
import pathlib

import pytest


def _convert(tmp_path_factory, input_path, name, **options):
    from wdsprep.conversion import convert

    output = tmp_path_factory.mktemp(f"deepreg-{name}")
    convert("deepreg", str(input_path), str(output), shard_bytes="256MB", **options)
    return output / "manifest.json"


@pytest.fixture(scope="session")
def deepreg_data(shared_data) -> pathlib.Path:
    root = shared_data / "deepreg"
    if not (root / "nifti").is_dir():
        pytest.skip(f"DeepReg test data not found at {root}")
    return root


@pytest.fixture(scope="session")
def converted(deepreg_data, tmp_path_factory):
    """name -> manifest path, converting lazily (each dataset at most once per session)."""
    cache = {}
    specs = {
        "nifti_paired": (deepreg_data / "nifti" / "paired", {}),
        "nifti_unpaired": (deepreg_data / "nifti" / "unpaired", {}),
        "nifti_grouped": (deepreg_data / "nifti" / "grouped", {}),
        "nifti_unpaired_unlabeled": (deepreg_data / "nifti" / "unpaired", {"deepreg_labeled": "false"}),
        "nifti_grouped_unlabeled": (deepreg_data / "nifti" / "grouped", {"deepreg_labeled": "false"}),
        "nifti_paired_unlabeled": (deepreg_data / "nifti" / "paired", {"deepreg_labeled": "false"}),
        # H5: six label files were never published, so only what exists is converted labeled
        "h5_paired_test": (deepreg_data / "h5" / "paired" / "test", None),
        "h5_paired_unlabeled": (deepreg_data / "h5" / "paired", {"deepreg_labeled": "false"}),
        "h5_unpaired": (deepreg_data / "h5" / "unpaired", {"deepreg_labeled": "false"}),
        "h5_grouped_test": (deepreg_data / "h5" / "grouped", {"deepreg_labeled": "false"}),
    }

    def get(name):
        if name not in cache:
            path, options = specs[name]
            if options is None:  # a single split dir: write a DeepReg YAML for it
                config = tmp_path_factory.mktemp(f"cfg-{name}") / "config.yaml"
                config.write_text(f"dataset:\n  type: paired\n  test:\n    dir: {path}\n    format: h5\n    labeled: true\n")
                path, options = config, {}
            cache[name] = _convert(tmp_path_factory, path, name, **options)
        return cache[name]

    return get
