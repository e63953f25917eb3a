import os
import pathlib

import pytest

# hang guards (subprocess and event limits) live in tests/timeouts.py: `from timeouts import SUBPROCESS, EVENT`
REPO = pathlib.Path(__file__).resolve().parent.parent
SHARED_DATA = pathlib.Path(os.environ.get("WDSPREP_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
    """The real data shipped beside the repo (read-only); tests using it skip when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return REPO
