"""`az://CONTAINER/BLOB` URLs (Azure Blob Storage; the account comes from the environment, as for
adlfs and the Azure CLI): read with plain ranged GETs of the Blob REST API over the process's pooled
`urllib3` connections (storage/http.py), so an az:// shard gets the read-ahead, retries, rate floor and
same-object check of every remote read; written by `AzureStore` through azure-storage-blob (block
uploads, listing, metadata).

The account, the way Azure's own tools take it, first found wins:
  AZURE_STORAGE_CONNECTION_STRING   (AccountName/AccountKey, a SharedAccessSignature, a BlobEndpoint:
                                     Azurite's connection string works as it is)
  AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY, or with AZURE_STORAGE_SAS_TOKEN, or alone: then the
                                     azure-identity chain (`DefaultAzureCredential`: environment,
                                     managed identity, `az login`)
Reads are authorised per request without signing each one: with an account key, by an account SAS
for reading made once per process (renewed before it expires); with a SAS, by it; with
azure-identity, by a bearer token (renewed likewise). Everything is per process (`per_process`):
a forked DataLoader worker makes its own.

Writing. A blob goes up as one request, or above `multipart_bytes` as blocks of `part_bytes`
committed at the end; either way it appears under its name only when complete (uncommitted blocks
are no blob, and Azure drops them after a week), with its sha256 as metadata.
"""
from __future__ import annotations

import datetime
import hashlib
import os
import threading
import time
from dataclasses import dataclass
from urllib.parse import quote

from ..errors import ConfigError, ShardError
from ..readoptions import ReadOptions
from .base import ObjectStore, per_process
from .http import HttpGetScheme
from .s3 import SHA256_METADATA

INSTALL = "az:// URLs need azure-storage-blob: pip install 'wdsprep[azure]'"
NO_ACCOUNT = ("no Azure storage account: set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT "
              "(with AZURE_STORAGE_KEY, AZURE_STORAGE_SAS_TOKEN, or an azure-identity login)")
VERSION = "2023-11-03"  # the Blob REST API version our requests speak
SCOPE = "https://storage.azure.com/.default"
RENEW = 600  # seconds before expiry a SAS or token is made anew
ENVIRONMENT = ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN")


@dataclass(frozen=True)
class Account:
    """Where the blobs are (`endpoint`, no trailing slash) and how to be let in: one of `key`, `sas`,
    or neither (azure-identity)."""

    name: str
    endpoint: str
    key: str | None = None
    sas: str | None = None


def _connection_string(text: str) -> Account:
    fields = dict(part.split("=", 1) for part in text.strip().split(";") if "=" in part)
    name = fields.get("AccountName", "")
    endpoint = fields.get("BlobEndpoint") or (
        f"{fields.get('DefaultEndpointsProtocol', 'https')}://{name}.blob.{fields.get('EndpointSuffix', 'core.windows.net')}")
    if not name and "SharedAccessSignature" not in fields:
        raise ShardError("az://", "AZURE_STORAGE_CONNECTION_STRING has no AccountName (nor a SharedAccessSignature)")
    return Account(name, endpoint.rstrip("/"), fields.get("AccountKey"), fields.get("SharedAccessSignature"))


def account() -> Account:
    """The account of the environment, now (see the module docstring)."""
    text = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    if text:
        return _connection_string(text)
    name = os.environ.get("AZURE_STORAGE_ACCOUNT")
    if not name:
        raise ShardError("az://", NO_ACCOUNT)
    return Account(name, f"https://{name}.blob.core.windows.net", os.environ.get("AZURE_STORAGE_KEY") or None,
                   (os.environ.get("AZURE_STORAGE_SAS_TOKEN") or "").lstrip("?") or None)


def _environment() -> tuple:
    return tuple(os.environ.get(name) for name in ENVIRONMENT)


class _Renewed:
    """A secret (a SAS, a token) made by `make() -> (value, expires at)`, made again `RENEW` seconds
    before it expires; shared by the threads of one process."""

    def __init__(self, make):
        self.make = make
        self.value, self.expires = None, 0.0
        self.lock = threading.Lock()

    def get(self) -> str:
        if time.time() > self.expires - RENEW:
            with self.lock:
                if time.time() > self.expires - RENEW:
                    self.value, self.expires = self.make()
        return self.value


def _read_sas(found: Account):
    try:
        from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas
    except ImportError:
        raise ShardError("az://", INSTALL) from None

    def make():
        expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=2)
        sas = generate_account_sas(found.name, found.key, ResourceTypes(container=True, object=True),
                                   AccountSasPermissions(read=True, list=True), expiry)
        return sas, expiry.timestamp()

    return _Renewed(make)


def token_credential():
    """This process's azure-identity credential chain."""
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise ShardError("az://", f"{NO_ACCOUNT}; for an azure-identity login: pip install azure-identity") from None
    return per_process(("azure-identity", *_environment()), DefaultAzureCredential)


def _bearer():
    def make():
        try:
            token = token_credential().get_token(SCOPE)
        except ShardError:
            raise
        except Exception as error:  # noqa: BLE001 -- azure-identity's chain says why in its own words
            raise ShardError("az://", f"no Azure credentials: {str(error).strip().splitlines()[0]}") from None
        return token.token, float(token.expires_on)

    return _Renewed(make)


def _authorisation() -> tuple[Account, _Renewed | None]:
    """(the account, what renews its read authorisation: a SAS or a token; None for a fixed SAS)."""
    def make():
        found = account()
        if found.key:
            return found, _read_sas(found)
        if found.sas:
            return found, None
        return found, _bearer()

    return per_process(("azure-read", *_environment()), make)


def split_az(url: str) -> tuple[str, str]:
    container, _, blob = url[len("az://") :].partition("/")
    if not container:
        raise ShardError(url, "an az:// URL needs a container: az://CONTAINER/BLOB")
    return container, blob


class AzureScheme(HttpGetScheme):
    writable = True
    webdataset = True  # plain `wds.WebDataset(urls)` reads through it (storage/gopen.py)
    example = "az://CONTAINER/PREFIX"

    def locate(self, url: str) -> tuple[str, dict]:
        container, blob = split_az(url)
        if not blob:
            raise ShardError(url, "an az:// URL to read needs a blob name: az://CONTAINER/BLOB")
        try:
            found, renewed = _authorisation()
            target = f"{found.endpoint}/{quote(container, safe='')}/{quote(blob)}"
            headers = {"x-ms-version": VERSION}
            if found.key:
                target += f"?{renewed.get()}"
            elif found.sas:
                target += f"?{found.sas}"
            else:
                headers["Authorization"] = f"Bearer {renewed.get()}"
        except ShardError as error:
            raise ShardError(url, str(error).split(": ", 1)[1]) from None
        return target, headers

    def explain(self, status: int, headers, body: bytes) -> str:
        code = headers.get("x-ms-error-code") or ""
        if code == "ContainerNotFound":
            return "no such container"
        if status == 404:
            return "no such object"
        if status in (401, 403):
            return f"access denied (HTTP {status}{' ' + code if code else ''})"
        return f"HTTP {status}{' ' + code if code else ''}"

    def store(self, url: str, **options) -> "AzureStore":
        return AzureStore(url, **options)


SCHEME = AzureScheme()


def service_client(max_single_put_size: int, max_block_size: int):
    """This process's azure-storage-blob client for the account of the environment, with these
    upload sizes."""
    try:
        from azure.storage.blob import BlobServiceClient
    except ImportError:
        raise ConfigError(INSTALL) from None

    def make():
        sizes = {"max_single_put_size": max_single_put_size, "max_block_size": max_block_size}
        text = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
        if text:
            return BlobServiceClient.from_connection_string(text, **sizes)
        found = account()
        credential = found.key and {"account_name": found.name, "account_key": found.key}
        return BlobServiceClient(found.endpoint, credential=credential or found.sas or token_credential(), **sizes)

    return per_process(("azure-client", max_single_put_size, max_block_size, *_environment()), make)


def _error_code(error: Exception) -> str:
    return getattr(error, "error_code", None) or ""


class AzureStore(ObjectStore):
    """A "directory" `az://container/prefix` of shards and a manifest (see the module docstring)."""

    reader = SCHEME

    def __init__(self, url: str, *, multipart_bytes: int | None = None, part_bytes: int | None = None, **options):
        container, prefix = split_az(url.rstrip("/"))
        self.container_name = container
        super().__init__(f"az://{container}", prefix)
        environment = ReadOptions.from_environment()  # checked before any request
        single = int(environment.s3_multipart_bytes if multipart_bytes is None else multipart_bytes)
        block = max(int(environment.s3_part_bytes if part_bytes is None else part_bytes), 1)
        try:
            self.container = service_client(single, block).get_container_client(container)
            found = self.container.exists()
        except ShardError as error:  # no account in the environment
            raise ConfigError(f"{url}: {str(error).split(': ', 1)[1]}") from None
        except ConfigError as error:
            raise ConfigError(f"{url}: {error}") from None
        except Exception as error:  # noqa: BLE001 -- one line for whatever the endpoint said
            code = _error_code(error) or getattr(getattr(error, "response", None), "status_code", "")
            if getattr(getattr(error, "response", None), "status_code", None) in (401, 403):
                raise ConfigError(f"{url}: access denied to container {container!r} ({code})") from None
            raise ConfigError(f"{url}: cannot reach Azure Blob Storage ({_first_line(error)})") from None
        if not found:
            raise ConfigError(f"{url}: no such container {container!r}")

    def _blob(self, name: str):
        return self.container.get_blob_client(self.key(name))

    # -- Store
    def upload_file(self, local_path: str, name: str, sha256: str | None = None) -> None:
        from azure.storage.blob import ContentSettings

        from .files import file_sha256

        digest = sha256 or file_sha256(local_path)
        with open(local_path, "rb") as handle:
            self._blob(name).upload_blob(handle, length=os.path.getsize(local_path), overwrite=True,
                                         metadata={SHA256_METADATA: digest},
                                         content_settings=ContentSettings(content_type="application/x-tar"))

    def recorded(self, name: str) -> tuple[int, str | None] | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            properties = self._blob(name).get_blob_properties()
        except ResourceNotFoundError:
            return None
        return int(properties.size), (properties.metadata or {}).get(SHA256_METADATA)

    def read_bytes(self, name: str) -> bytes | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return self._blob(name).download_blob().readall()
        except ResourceNotFoundError:
            return None

    def write_bytes(self, name: str, data: bytes) -> None:
        from azure.storage.blob import ContentSettings

        content_type = "application/json" if name.endswith(".json") else "application/octet-stream"
        self._blob(name).upload_blob(data, overwrite=True, metadata={SHA256_METADATA: hashlib.sha256(data).hexdigest()},
                                     content_settings=ContentSettings(content_type=content_type))

    def delete(self, name: str) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            self._blob(name).delete_blob()
        except ResourceNotFoundError:
            pass

    def list_names(self) -> list[str]:
        start = f"{self.prefix}/" if self.prefix else ""
        names = (item.name[len(start) :] for item in self.container.walk_blobs(name_starts_with=start, delimiter="/"))
        return sorted(name for name in names if name and not name.endswith("/"))


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
