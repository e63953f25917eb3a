import pathlib

import pytest

from wdsprep.sources.rawnind.synth import synth


@pytest.fixture(scope="session")
def synth_tiny(tmp_path_factory) -> pathlib.Path:
    """A tiny synthetic Dataverse directory (2 scenes, 196 kB DNGs); treat as read-only."""
    root = tmp_path_factory.mktemp("rawnind_tiny")
    synth(str(root), seed=1, size="tiny")
    return root


@pytest.fixture(scope="session")
def synth_small(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("rawnind_small")
    synth(str(root), seed=0, size="small")
    return root

