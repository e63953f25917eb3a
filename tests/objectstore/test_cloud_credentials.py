"""Credentials the way each cloud's users have them, and their absence as one line: gs:// without
application default credentials, az:// without an account, az:// with a wrong key (Azurite's own
403). No request leaves the machine: the metadata server Google's library would ask on a VM is
pointed at a closed local port."""
import os
import subprocess
import sys

import pytest

from tests.timeouts import SUBPROCESS

CLOUD_VARIABLES = ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_STORAGE_CONNECTION_STRING",
                   "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN")


def _bare_environment(tmp_path) -> dict:
    env = {name: value for name, value in os.environ.items() if name not in CLOUD_VARIABLES}
    env.update({"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "no-key.json"),  # ADC: a missing key file
                "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9", "NO_GCE_CHECK": "True",
                "HOME": str(tmp_path), "CLOUDSDK_CONFIG": str(tmp_path / "gcloud")})
    return env


def _one_line(args, env) -> str:
    result = subprocess.run([sys.executable, "-m", "wdsprep", *args], capture_output=True, text=True,
                            timeout=SUBPROCESS, env=env)
    assert result.returncode in (1, 2) and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    return line


@pytest.mark.parametrize("command", ["inspect", "upload"])
def test_gs_without_credentials_is_one_line(tmp_path, generic_shards, command):
    args = ["inspect", "gs://some-bucket/ds"] if command == "inspect" else ["upload", str(generic_shards), "gs://some-bucket/ds"]
    line = _one_line(args, _bare_environment(tmp_path))
    assert line.startswith("wdsprep: error: gs://some-bucket/ds") and "no Google Cloud credentials found" in line, line
    assert "GOOGLE_APPLICATION_CREDENTIALS" in line


@pytest.mark.parametrize("command", ["inspect", "upload"])
def test_az_without_an_account_is_one_line(tmp_path, generic_shards, command):
    args = ["inspect", "az://some-container/ds"] if command == "inspect" else ["upload", str(generic_shards), "az://some-container/ds"]
    line = _one_line(args, _bare_environment(tmp_path))
    assert line.startswith("wdsprep: error: az://some-container/ds") and "no Azure storage account" in line, line


def test_az_with_a_wrong_key_is_azurites_403_in_one_line(tmp_path, generic_shards, azurite_server):
    container = azurite_server.create_container("wrong-key")
    env = {**_bare_environment(tmp_path), **azurite_server.env}
    good = env["AZURE_STORAGE_CONNECTION_STRING"]
    with azurite_server.environment():
        from wdsprep.upload import upload

        upload(str(generic_shards), f"az://{container}/ds", quiet=True)
    key = good.split("AccountKey=")[1].split(";")[0]
    env["AZURE_STORAGE_CONNECTION_STRING"] = good.replace(key, key[:-8] + "AAAAAAA=")
    line = _one_line(["inspect", f"az://{container}/ds"], env)
    assert line.startswith(f"wdsprep: error: az://{container}/ds/manifest.json: cannot read manifest"), line
    assert "access denied (HTTP 403" in line
    line = _one_line(["upload", str(generic_shards), f"az://{container}/other"], env)
    assert line.startswith(f"wdsprep: error: az://{container}/other: access denied"), line
