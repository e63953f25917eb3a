"""A Hugging Face Hub endpoint for tests and benchmarks: repos held in memory, served on 127.0.0.1
(free port) with the few routes huggingface_hub and `hf://` reading use, answered as the Hub answers:

    GET  /api/{datasets|spaces|models}/ORG/NAME/revision/REV   repo info: the commit REV names (`sha`), files
    GET  /api/{...}/ORG/NAME/tree/REV[/PATH]                   the files under PATH (sizes; `lfs.oid` = sha256)
    GET|HEAD /[datasets/|spaces/]ORG/NAME/resolve/REV/PATH     a file: small ones served here (Range, ETag),
                                                               large ones (LFS) by a 302 to /lfs-objects/SHA256
    GET|HEAD /lfs-objects/SHA256                               the file storage (Range, ETag), no token
                                                               (`expire_storage_urls` moves it: old URLs 404)

Errors carry the Hub's `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo),
which huggingface_hub turns into its own exceptions. A private repo answers only a request with
`Authorization: Bearer <token>` (`HubServer.token`), like a missing one otherwise (401, RepoNotFound);
a gated repo answers 403 (GatedRepo) to every token not `grant`ed.

Repos are written server-side, as commits: `commit(repo, {path: bytes})` makes a new commit on a
branch (its parent's files plus these) and returns its 40-hex id; `upload_folder` commits a local
folder; `move_branch` points a branch at another commit (a branch that moved after a run started).
Every request is logged (`requests`: method, path, range, status).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from ._ranges import byte_range
from ._environment import WithEnvironment
from ._threaded import ServedInThread

LFS_BYTES = 10_000  # files this large or larger are LFS files (served by a redirect), like .tar shards
KINDS = ("datasets", "spaces", "models")


@dataclass
class _Repo:
    private: bool = False
    gated: bool = False
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> {path: bytes}
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # quiet
        pass

    def do_GET(self):
        self._serve(head=False)

    def do_HEAD(self):
        self._serve(head=True)

    def _serve(self, head: bool) -> None:
        hub = self.server.owner
        path = urlsplit(self.path).path
        record = {"method": self.command, "path": unquote(path), "range": self.headers.get("Range"), "status": None}
        with hub.lock:
            hub.requests.append(record)
        try:
            self._route(path, head, record)
        except (ConnectionError, OSError):
            self.close_connection = True

    def _route(self, path: str, head: bool, record: dict) -> None:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:1] == [self.server.owner.storage] and len(parts) == 2:
            data = self.server.owner.lfs.get(parts[1])
            if data is None:
                return self._error(404, record, "EntryNotFound")
            return self._send_bytes(data, f'"{parts[1]}"', head, record, {})
        if parts[:1] == ["api"] and len(parts) >= 6 and parts[1] in KINDS:
            kind, repo, verb, revision, rest = parts[1], f"{parts[2]}/{parts[3]}", parts[4], parts[5], parts[6:]
            if verb in ("revision", "tree"):
                return self._api(kind, repo, verb, revision, "/".join(rest), record)
        kind = parts[0] if parts and parts[0] in ("datasets", "spaces") else "models"
        rest = parts[1:] if kind != "models" else parts
        if len(rest) >= 5 and rest[2] == "resolve":
            return self._resolve(kind, f"{rest[0]}/{rest[1]}", rest[3], "/".join(rest[4:]), head, record)
        self._error(404, record, None)

    # -- answers
    def _error(self, status: int, record: dict, code: str | None, message: str = "") -> None:
        record["status"] = status
        body = json.dumps({"error": message or code or "not found"}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        if message:
            self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, value, record: dict) -> None:
        record["status"] = 200
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_bytes(self, data: bytes, etag: str, head: bool, record: dict, headers: dict) -> None:
        status, start, stop, malformed = byte_range(self.headers.get("Range"), len(data))
        if malformed or status == 416:
            record["status"] = 416
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(data)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        record["status"] = status
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("ETag", etag)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(stop - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
        self.end_headers()
        if not head:
            self.wfile.write(data[start:stop])

    # -- the repo's view for this request
    def _open(self, kind: str, repo_id: str, revision: str, record: dict):
        """(repo, commit id) or None when the answer (an error) was sent."""
        hub = self.server.owner
        repo = hub.repos.get((kind, repo_id))
        given = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if repo is None or (repo.private and given != hub.token):
            self._error(404 if repo is None and given else 401, record, "RepoNotFound",
                        "Repository not found" if repo is None else "Invalid username or password.")
            return None
        if repo.gated and given not in hub.granted:
            self._error(403, record, "GatedRepo", "Access to this repo is restricted: accept its conditions first")
            return None
        commit = repo.refs.get(revision) or (revision if revision in repo.commits else None)
        if commit is None:
            self._error(404, record, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return repo, commit

    def _api(self, kind: str, repo_id: str, verb: str, revision: str, path: str, record: dict) -> None:
        opened = self._open(kind, repo_id, revision, record)
        if opened is None:
            return
        repo, commit = opened
        files = repo.commits[commit]
        if verb == "revision":
            now = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc).isoformat().replace("+00:00", ".000Z")
            return self._json({"_id": repo_id, "id": repo_id, "author": repo_id.split("/")[0], "sha": commit,
                               "private": repo.private, "gated": repo.gated and "manual", "disabled": False,
                               "downloads": 0, "likes": 0, "tags": [], "lastModified": now, "createdAt": now,
                               "siblings": [{"rfilename": name} for name in sorted(files)]}, record)
        start = f"{path.strip('/')}/" if path.strip("/") else ""
        entries = []
        for name in sorted(files):
            if name.startswith(start) and "/" not in name[len(start) :]:
                data = files[name]
                entry = {"type": "file", "oid": _git_oid(data), "size": len(data), "path": name}
                if len(data) >= LFS_BYTES:
                    entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 130}
                entries.append(entry)
        folders = sorted({name[len(start) :].split("/", 1)[0] for name in files
                          if name.startswith(start) and "/" in name[len(start) :]})
        entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": start + folder} for folder in folders]
        if not entries and start:
            return self._error(404, record, "EntryNotFound", f"{path} does not exist")
        self._json(entries, record)

    def _resolve(self, kind: str, repo_id: str, revision: str, path: str, head: bool, record: dict) -> None:
        opened = self._open(kind, repo_id, revision, record)
        if opened is None:
            return
        repo, commit = opened
        data = repo.commits[commit].get(path)
        if data is None:
            return self._error(404, record, "EntryNotFound", f"{path} does not exist at {revision}")
        headers = {"X-Repo-Commit": commit}
        if len(data) < LFS_BYTES:
            return self._send_bytes(data, f'"{_git_oid(data)}"', head, record, headers)
        digest = hashlib.sha256(data).hexdigest()
        record["status"] = 302
        self.send_response(302)
        self.send_header("Location", f"/{self.server.owner.storage}/{digest}")
        self.send_header("X-Linked-Etag", f'"{digest}"')
        self.send_header("X-Linked-Size", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address):
        pass


class HubServer(ServedInThread, WithEnvironment):
    """`with HubServer() as hub:` — `hub.url`, `hub.env` (HF_ENDPOINT, HF_TOKEN), `hub.environment()`."""

    name = "hub"

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.host, self.port = host, port
        self.token = "hf_wdsprep_test_token"
        self.granted: set[str] = set()
        self.repos: dict[tuple[str, str], _Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.storage = "lfs-objects"  # the path of the file storage (`expire_storage_urls` changes it)
        self.requests: list[dict] = []
        self.lock = threading.Lock()

    def start(self) -> "HubServer":
        return self._serve_http(_Server, _Handler, "hub-test-server")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def via(self, url: str) -> dict[str, str]:
        return {"HF_ENDPOINT": url, "HF_TOKEN": self.token, "HF_HUB_DISABLE_TELEMETRY": "1",
                "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}

    @property
    def env(self) -> dict[str, str]:
        return self.via(self.url)

    # -- repos, written here
    def create_repo(self, repo_id: str, kind: str = "datasets", *, private: bool = False, gated: bool = False) -> str:
        with self.lock:
            repo = self.repos[(kind, repo_id)] = _Repo(private=private, gated=gated)
            initial = hashlib.sha1(f"{kind}/{repo_id} initial".encode()).hexdigest()
            repo.commits[initial] = {}
            repo.refs["main"] = initial
        return initial

    def grant(self, token: str) -> None:
        """Let `token` into the gated repos (its owner accepted their conditions)."""
        self.granted.add(token)

    def commit(self, repo_id: str, files: dict[str, bytes], kind: str = "datasets", branch: str = "main") -> str:
        """A new commit on `branch`: its parent's files plus `files` (a branch that does not exist yet
        starts from main's head). Its 40-hex id."""
        with self.lock:
            repo = self.repos[(kind, repo_id)]
            parent = repo.refs.get(branch) or repo.refs["main"]
            tree = {**repo.commits[parent], **files}
            commit = hashlib.sha1(json.dumps([parent, sorted((name, _git_oid(data)) for name, data in tree.items())])
                                  .encode()).hexdigest()
            repo.commits[commit] = tree
            repo.refs[branch] = commit
            for data in files.values():
                if len(data) >= LFS_BYTES:
                    self.lfs[hashlib.sha256(data).hexdigest()] = data
        return commit

    def upload_folder(self, repo_id: str, folder: str | os.PathLike, path_in_repo: str = "", kind: str = "datasets",
                      branch: str = "main") -> str:
        """Commit every file under a local folder, at `path_in_repo`."""
        files = {}
        for root, _, names in os.walk(folder):
            for name in names:
                local = os.path.join(root, name)
                relative = os.path.relpath(local, folder).replace(os.sep, "/")
                with open(local, "rb") as handle:
                    files[f"{path_in_repo.strip('/')}/{relative}".lstrip("/")] = handle.read()
        return self.commit(repo_id, files, kind, branch)

    def move_branch(self, repo_id: str, branch: str, commit: str, kind: str = "datasets") -> None:
        with self.lock:
            self.repos[(kind, repo_id)].refs[branch] = commit

    def expire_storage_urls(self) -> None:
        """Every storage URL `resolve` gave so far stops answering (404), as the Hub's signed URLs do
        when they expire; `resolve` gives new ones."""
        with self.lock:
            self.storage = f"lfs-objects-{len(self.storage)}"

    def clear_log(self) -> None:
        with self.lock:
            self.requests.clear()
