"""Fixtures shared by every test folder. tests/ and each folder are packages: helpers are imported
as package modules (`from tests.timeouts import SUBPROCESS`, `from .voxels_testdata import make_tiny`),
never through sys.path tricks. Hang guards (subprocess and event limits) live in tests/timeouts.py."""
import os
import pathlib

import pytest

pytest.register_assert_rewrite("wdsprep.conformance")  # the suite's asserts explain their failures

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


@pytest.fixture(scope="session")
def s3_server():
    """The project's S3 test server (moto, 127.0.0.1, ephemeral port), one per session."""
    from wdsprep.testing import S3Server

    with S3Server() as server:
        yield server


@pytest.fixture(scope="session")
def labelled_conversion(tmp_path_factory):
    """(input folder, its values, the output folder): tests/core/selectdata.py's labelled generic input
    converted once by `wdsprep pipeline` with its index fields (the selection and sample-table tests
    share it and never change it: tests that do work on a copy)."""
    from tests.core.selectdata import convert_with_fields, write_labelled_input

    root = tmp_path_factory.mktemp("labelled")
    values = write_labelled_input(root / "in")
    status, _, err = convert_with_fields(root / "in", root / "out")
    assert status == 0, err
    return root / "in", values, root / "out"


def _emulator(kind):
    """One emulator per session (`wdsprep.testing.emulators`): skipped, with the reason, only where it
    is not installed on this machine (no node for Azurite, the package missing); one that is installed
    and fails to start fails the tests."""
    server = kind()
    try:
        server.start()
    except FileNotFoundError as error:
        pytest.skip(f"{server.name} unavailable: {error}")
    return server


@pytest.fixture(scope="session")
def gcs_server():
    """fake-gcs-server (gs://), 127.0.0.1, a free port, one per session."""
    from wdsprep.testing import GCSServer

    server = _emulator(GCSServer)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def azurite_server():
    """Azurite's blob service (az://), 127.0.0.1, a free port, one per session."""
    from wdsprep.testing import AzuriteServer

    server = _emulator(AzuriteServer)
    yield server
    server.stop()
