"""`hf://` URLs (the Hugging Face Hub), in the form huggingface_hub's own file system writes them:

    hf://datasets/ORG/NAME[@REVISION]/PATH      a dataset repo (also `spaces/ORG/NAME...`;
    hf://ORG/NAME[@REVISION]/PATH               a model repo)

REVISION is a branch, a tag or a commit (default `main`; a revision with a slash, `refs/pr/1`, is
written quoted, `refs%2Fpr%2F1`). Bytes are plain ranged GETs of the Hub's
`{endpoint}/datasets/ORG/NAME/resolve/{revision}/{path}` over the process's pooled `urllib3` connections
(storage/http.py: the read-ahead, retries, rate floor and same-object check of every remote read),
following the Hub's redirects to its file storage. Where a file of a commit was redirected to is
remembered per process for a few minutes, so its next ranges are one request each; a remembered
location that fails is forgotten and the file resolved again. Read-only (see docs/objectstore.md).

Pinning. A branch moves; a run must not. `pin(url)` resolves the revision to its commit once, with
huggingface_hub (`HfApi.repo_info`), and gives the URL naming that commit (`@<40 hex>`): a manifest
is loaded through its pinned URL (stream/manifests.py), so every shard URL of a dataset names the
commit, `inspect` and a mix show it, and a state records it (a resumed run reads the recorded
commit however the branch moved since: stream/dataset.py). A URL that names a commit is not
resolved again.

Credentials and endpoint as huggingface_hub takes them: the token from `HF_TOKEN` or the login file
(`hf auth login`; `huggingface_hub.get_token`), sent only to the endpoint; `HF_ENDPOINT` (default
https://huggingface.co), read when used. Per process, like every client (`per_process`).
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, replace
from urllib.parse import quote, unquote

from ..errors import ShardError
from .base import per_process
from .http import HttpGetScheme

ENDPOINT = "https://huggingface.co"
REMEMBER = 300.0  # seconds a file's storage location (a signed URL, valid far longer) is used without `resolve`
REMEMBERED_FILES = 4096  # storage locations kept per process at most
KINDS = {"datasets": "dataset", "spaces": "space"}  # URL prefix -> huggingface_hub's repo_type (else a model)
COMMIT = re.compile(r"[0-9a-f]{40}")
INSTALL = "hf:// URLs need huggingface_hub: pip install 'wdsprep[hf]'"
LOGIN = "set HF_TOKEN or run `hf auth login` if it is private or gated"


@dataclass(frozen=True)
class HubPath:
    """One file (or folder) of a Hub repo at a revision: `kind` "datasets", "spaces" or "" (models)."""

    kind: str
    repo: str
    revision: str | None
    path: str

    @property
    def repo_type(self) -> str:
        return KINDS.get(self.kind, "model")

    @property
    def named(self) -> str:
        return f"{self.kind}/{self.repo}" if self.kind else self.repo

    def url(self) -> str:
        at = f"@{quote(self.revision, safe='')}" if self.revision else ""
        return f"hf://{self.named}{at}/{self.path}" if self.path else f"hf://{self.named}{at}"


def parse(url: str) -> HubPath:
    parts = url[len("hf://") :].split("/")
    kind = parts.pop(0) if parts and parts[0] in KINDS else ""
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise ShardError(url, "an hf:// URL names a repo: hf://datasets/ORG/NAME[@REVISION]/PATH")
    name, _, revision = parts[1].partition("@")
    return HubPath(kind, f"{parts[0]}/{name}", unquote(revision) or None, "/".join(parts[2:]))


def _remembered() -> dict:
    """This process's remembered storage locations: hf:// URL of a commit's file -> (URL, until)."""
    return per_process(("hf-locations",), dict)


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or ENDPOINT).rstrip("/")


def token() -> str | None:
    """The user's Hub token (HF_TOKEN, else the login file), as huggingface_hub finds it."""
    try:
        from huggingface_hub import get_token
    except ImportError:
        return os.environ.get("HF_TOKEN") or None
    key = ("hf-token", *(os.environ.get(name) for name in ("HF_TOKEN", "HF_TOKEN_PATH", "HF_HOME")))
    return per_process(key, lambda: get_token() or "") or None


def _api():
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise ShardError("hf://", INSTALL) from None
    return HfApi(endpoint=endpoint(), token=token() or False)


def resolve(url: str) -> str:
    """The commit `url`'s revision names now (one request to the Hub)."""
    where = parse(url)
    try:
        from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
    except ImportError:
        raise ShardError(url, INSTALL) from None
    revision = where.revision or "main"
    try:
        info = _api().repo_info(where.repo, repo_type=where.repo_type, revision=revision)
    except RevisionNotFoundError:
        raise ShardError(url, f"no revision {revision!r} in {where.named}") from None
    except GatedRepoError:
        raise ShardError(url, f"access denied to {where.named}: a gated repo, accept its conditions on the Hub "
                              f"with the account of your token ({LOGIN})") from None
    except RepositoryNotFoundError:
        raise ShardError(url, f"no repository {where.named} at {endpoint()} ({LOGIN})") from None
    except HfHubHTTPError as error:
        status = getattr(getattr(error, "response", None), "status_code", None)
        if status == 403:
            raise ShardError(url, f"access denied to {where.named} (HTTP 403; {LOGIN})") from None
        raise ShardError(url, f"the Hub at {endpoint()} answered {status or 'an error'}") from None
    except OSError as error:
        raise ShardError(url, f"cannot reach the Hub at {endpoint()} ({error})") from None
    return info.sha


class HubScheme(HttpGetScheme):
    webdataset = True  # plain `wds.WebDataset(urls)` reads through it (storage/gopen.py)
    example = "hf://datasets/ORG/NAME[@REVISION]/PATH"

    def locate(self, url: str) -> tuple[str, dict]:
        remembered = _remembered().get(url)
        if remembered is not None and remembered[1] > time.monotonic():
            return remembered[0], {}  # the storage's signed URL: no token goes there
        where = parse(url)
        if not where.path:
            raise ShardError(url, "an hf:// URL to read names a file: hf://datasets/ORG/NAME[@REVISION]/PATH")
        prefix = f"{where.kind}/" if where.kind else ""
        target = (f"{endpoint()}/{prefix}{where.repo}/resolve/{quote(where.revision or 'main', safe='')}/"
                  f"{quote(where.path)}")
        found = token()
        return target, ({"Authorization": f"Bearer {found}"} if found else {})

    def explain(self, status: int, headers, body: bytes) -> str:
        code = headers.get("X-Error-Code") or ""
        if code == "RevisionNotFound":
            return "no such revision"
        if code == "RepoNotFound" or status == 401:
            return f"no such repository ({LOGIN})"
        if status == 404:
            return "no such object"
        if status == 403:
            return f"access denied (HTTP 403; {LOGIN})"
        return f"HTTP {status}{' ' + code if code else ''}"

    def arrived(self, url: str, target: str, final: str) -> None:
        """Remember where `resolve` sent a file of a commit (its storage), for `REMEMBER` seconds: the
        next ranges of that file go there at once, one request each instead of two."""
        revision = parse(url).revision
        if revision is not None and COMMIT.fullmatch(revision):
            remembered = _remembered()
            if len(remembered) >= REMEMBERED_FILES:
                remembered.clear()
            remembered[url] = (final, time.monotonic() + REMEMBER)

    def stale(self, url: str, target: str) -> bool:
        remembered = _remembered()
        if remembered.get(url, (None,))[0] == target:
            remembered.pop(url, None)
            return True
        return False

    def pin(self, url: str) -> str:
        where = parse(url)
        if where.revision is not None and COMMIT.fullmatch(where.revision):
            return url
        return replace(where, revision=resolve(url)).url()

    def unpinned(self, url: str) -> str:
        return replace(parse(url), revision=None).url()


SCHEME = HubScheme()
