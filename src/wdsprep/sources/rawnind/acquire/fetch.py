"""The acquisition pipeline: ingest -> scan -> download -> verify -> index scenes -> metadata.

Every stage is a trio task (downloads: `concurrency` tasks; metadata: `metadata_workers` tasks
running the CPU work in threads) connected by bounded memory channels, so memory does not grow
with the dataset and backpressure reaches the ingestor. Download tasks hand a finished file to the
single verifier and wait for its verdict on a one-slot reply channel, which keeps the retry
decision with the download task and avoids a channel cycle (verifier -> downloader) that could
deadlock when both buffers are full.

Robustness rules:
- a file reaches its final name only after its SHA-1 matched the index (downloads go to
  `<name>.part`), so a final-name file is verified by construction and never fetched again;
- an interrupted download keeps its `.part`; the next attempt (or run) continues it with
  `Range: bytes=<size>-`;
- transient failures (5xx, dropped connections, timeouts, short bodies, SHA-1 mismatches) are
  retried `attempts` times in all with exponential backoff; 404/403/410 fail at once; a failure
  is reported with its reason and never stops the other files;
- a file that cannot be written (disk full, unwritable folder) is a reported failure naming it;
- a bad index, an unreachable server at start (probed once even when `--listing`/`--index` are
  local files) or an unwritable destination stop everything at once with one
  `FetchError`/`InputError` message.

With `convert` (an output directory or `s3://` URL) complete scenes go to conversion workers
instead of the metadata stage (`streamconvert`): each becomes its own unit of shards, and its raw
files are removed once those shards are checked in the store (`keep_raw` keeps them). The
ingestor admits a scene only while the bytes of the admitted, not yet removed scenes stay within
`max_raw_bytes` (one scene is always admitted, so the bound is at least the largest scene), so
local disk never holds more raws than that; `raw_bytes` counts what is on disk (downloads add,
removals subtract) and the report gives its peak. Scenes converted by an earlier run are not
fetched again.

Progress is one `wdsprep.progress.Progress`: it counts the files done and the bytes downloaded,
draws them (a line redrawn on a terminal, `[rawnind fetch] ...` log lines elsewhere), and the
report's `bytes_downloaded` is its byte count, so what is shown and what is reported cannot differ.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx
import trio

from ....errors import DownloadError, FetchError, InputError, WdsprepError
from ....progress import Progress, human_bytes
from ..index import (
    DATAVERSE_INDEX_NAME,
    DEFAULT_DOI,
    INDEX_FILENAME,
    LISTING_FILENAME,
    ImageInfo,
    RemoteFile,
    SceneInfo,
    build_scenes,
    parse_index,
    parse_listing,
    plan_summary,
)

HASH_BLOCK = 4 * 1024 * 1024
PERMANENT_STATUSES = (401, 403, 404, 410)


@dataclass
class FetchOptions:
    dest: str
    dataverse: str | None = None
    doi: str = DEFAULT_DOI
    index: str | None = None  # path or URL; default: dataset.yaml from the listing
    listing: str | None = None  # path or URL; default: the dataset JSON from `dataverse`
    concurrency: int = 5
    max_scenes: int | None = None
    cfa: str | None = None
    scenes: list[str] | None = None
    dry_run: bool = False
    metadata: bool = True
    metadata_workers: int = 4
    attempts: int = 3
    backoff: float = 1.0
    timeout: float = 60.0
    progress: str = "auto"  # auto | bar | log | none
    log_interval: float = 10.0
    report: str | None = None
    chunk_size: int = 256 * 1024
    channel_size: int = 16
    rehash: bool = False
    stream: TextIO | None = None
    convert: str | None = None  # output dir or s3:// URL: convert each scene as soon as it is complete
    convert_options: dict = field(default_factory=dict)  # tile_size, layout, shard_bytes, codec, on_error
    keep_raw: bool = False  # with convert: keep the raw files of converted scenes
    max_raw_bytes: int | None = None  # with convert: bound on the raw bytes of scenes in flight
    driver: Any = None  # with convert: the core's conversion driver, `wdsprep.Conversion` (the command hands it)


@dataclass
class FileResult:
    status: str  # present | verified | failed | unmatched
    reason: str | None = None
    attempts: int = 0


@dataclass
class Stats:
    present: int = 0
    verified: int = 0
    failed: int = 0
    unmatched: int = 0
    retries: int = 0
    active: dict[str, list[int]] = field(default_factory=dict)  # name -> [done, total]
    bytes_hashed: int = 0
    hash_seconds: float = 0.0
    scenes_total: int = 0
    scenes_complete: int = 0
    scenes_incomplete: int = 0
    metadata_done: int = 0
    pairs_computed: int = 0
    scenes_converted: int = 0


def sha1_file(path: str) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as handle:
        while True:
            block = handle.read(HASH_BLOCK)
            if not block:
                return digest.hexdigest()
            digest.update(block)


def _is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


class Fetcher:
    def __init__(self, options: FetchOptions):
        self.options = options
        self.stats = Stats()
        self.stream = options.stream or sys.stderr
        self.results: dict[str, dict] = {}
        self.incomplete_scenes: list[dict] = []
        self.metadata_problems: list[dict] = []
        self.client: httpx.AsyncClient | None = None
        self.progress: Progress | None = None  # counts the files done and the bytes downloaded; made by `run`
        self.base = (options.dataverse or "").rstrip("/")
        self.started = time.monotonic()
        self.metadata_cache = None
        self.converter = None  # a streamconvert.SceneConverter with `convert`
        self.all_scenes: list[SceneInfo] = []  # with `convert`: every selected scene, done or not
        self.convert_problems: list[dict] = []
        self.converted_before: list[str] = []
        self.raw_bytes = 0  # raw bytes on local disk (finished and partial downloads of selected scenes)
        self.raw_peak = 0
        self.reserved = 0  # bytes of the admitted scenes whose raws are not removed yet
        self.scene_bytes: dict[str, int] = {}
        self._released: trio.Event | None = None

    # ----------------------------------------------------------------------------- raw bytes
    def _grow(self, count: int) -> None:
        self.raw_bytes += count
        self.raw_peak = max(self.raw_peak, self.raw_bytes)

    def _remove(self, path: str) -> None:
        """Delete a raw file (final or partial) and take it off the count."""
        try:
            size = os.path.getsize(path)
            os.remove(path)
        except FileNotFoundError:
            return
        self.raw_bytes -= size

    async def _admit(self, scene: SceneInfo) -> None:
        bound = self.options.max_raw_bytes
        size = self.scene_bytes[scene.key]
        while bound is not None and self.reserved and self.reserved + size > bound:
            await self._released.wait()
        self.reserved += size

    def _release(self, scene: SceneInfo) -> None:
        self.reserved -= self.scene_bytes[scene.key]
        self._released.set()
        self._released = trio.Event()

    def _remove_scene_raws(self, scene: SceneInfo) -> None:
        """A converted scene's files, its masks in the metadata cache, and its emptied folders."""
        from ..metadata import mask_path, pair_key, scene_pairs

        for image in scene.files:
            self._remove(self._final_path(image))
            self._remove(self._final_path(image) + ".part")
        for gt, y_clean, y in scene_pairs(len(scene.clean), len(scene.noisy)):
            other = (scene.clean if y_clean else scene.noisy)[y]
            try:
                os.remove(mask_path(self.options.dest, pair_key(scene.clean[gt].sha1, other.sha1)))
            except FileNotFoundError:
                pass
        for folder in (os.path.join(self.options.dest, scene.cfa, scene.name, "gt"), os.path.join(self.options.dest, scene.cfa, scene.name)):
            try:
                os.rmdir(folder)
            except OSError:
                pass  # not empty (a file of another run) or already gone

    # ----------------------------------------------------------------------------------- setup
    def _check_destination(self) -> None:
        dest = self.options.dest
        try:
            os.makedirs(dest, exist_ok=True)
            probe = os.path.join(dest, f".wdsprep-write-probe-{os.getpid()}")
            with open(probe, "wb") as handle:
                handle.write(b"ok")
            os.remove(probe)
        except OSError as error:
            raise FetchError(f"{dest}: destination is not writable ({error.strerror or error})") from None

    async def _get_bytes(self, url: str, params: dict | None = None, what: str = "") -> bytes:
        assert self.client is not None
        try:
            response = await self.client.get(url, params=params)
        except httpx.HTTPError as error:
            raise FetchError(f"cannot reach Dataverse at {url} ({type(error).__name__}: {error})") from None
        if response.status_code != 200:
            raise FetchError(f"{response.url}: HTTP {response.status_code} while fetching {what}")
        return response.content

    async def _probe_server(self) -> None:
        """Fail at once when the Dataverse server does not answer (any HTTP reply will do).

        Only needed when the listing is not fetched from it first (`--listing` given): otherwise
        an unreachable server would surface only after every file's retries.
        """
        assert self.client is not None
        url = f"{self.base}/api/datasets/:persistentId"
        try:
            await self.client.get(url, params={"persistentId": self.options.doi})
        except httpx.HTTPError as error:
            raise FetchError(f"cannot reach Dataverse at {url} ({type(error).__name__}: {error})") from None

    async def _read_given(self, location: str, what: str) -> bytes:
        """The bytes of a file the user named: a local path, or a URL fetched like the rest."""
        if _is_url(location):
            return await self._get_bytes(location, what=what)
        try:
            with open(location, "rb") as handle:
                return handle.read()
        except OSError as error:
            raise InputError(f"{location}: cannot read {what} ({error.strerror})") from None

    async def _load_listing(self) -> tuple[dict[str, RemoteFile], bytes | None]:
        options = self.options
        if options.listing:
            raw = await self._read_given(options.listing, "the Dataverse listing")
            return parse_listing(raw, options.listing), raw
        if not self.base:
            raise FetchError("no Dataverse listing: pass --dataverse BASE_URL or --listing PATH")
        url = f"{self.base}/api/datasets/:persistentId"
        raw = await self._get_bytes(url, {"persistentId": options.doi}, what=f"the dataset {options.doi}")
        return parse_listing(raw, f"{url}?persistentId={options.doi}"), raw

    async def _load_index(self, listing: dict[str, RemoteFile]) -> tuple[dict, bytes]:
        options = self.options
        if options.index:
            raw = await self._read_given(options.index, "the index")
            return parse_index(raw, options.index), raw
        remote = listing.get(DATAVERSE_INDEX_NAME)
        if remote is not None and self.base:
            url = f"{self.base}/api/access/datafile/{remote.id}"
            raw = await self._get_bytes(url, what=f"the index {DATAVERSE_INDEX_NAME}")
            return parse_index(raw, url), raw
        cached = os.path.join(options.dest, INDEX_FILENAME)
        if os.path.exists(cached):
            with open(cached, "rb") as handle:
                raw = handle.read()
            return parse_index(raw, cached), raw
        raise FetchError(f"no index: the listing has no {DATAVERSE_INDEX_NAME}; pass --index PATH_OR_URL")

    # ---------------------------------------------------------------------------------- stages
    async def _ingest(self, scenes: list[SceneInfo], send: trio.MemorySendChannel) -> None:
        async with send:
            for scene in scenes:
                if self.converter is not None:
                    await self._admit(scene)
                await send.send(scene)

    def _final_path(self, image: ImageInfo) -> str:
        return os.path.join(self.options.dest, image.relpath)

    async def _scan(self, receive, download_send, done_send) -> None:
        async with receive, download_send, done_send:
            async for scene in receive:
                for image in scene.files:
                    final = self._final_path(image)
                    if not image.downloadable:
                        status = "unmatched" if image.role == "sidecar" else "failed"
                        await done_send.send((scene, image, FileResult(status, "not on Dataverse (no file id)")))
                        continue
                    if os.path.isfile(final) and (image.size is None or os.path.getsize(final) == image.size):
                        if not self.options.rehash or await trio.to_thread.run_sync(sha1_file, final) == image.sha1:
                            await done_send.send((scene, image, FileResult("present")))
                            continue
                    if os.path.exists(final):  # wrong size or hash: not ours to trust
                        self._remove(final)
                    await download_send.send((scene, image))

    async def _download_worker(self, jobs, verify_send, done_send) -> None:
        async with jobs, verify_send, done_send:
            async for scene, image in jobs:
                result = await self._fetch_one(image, verify_send)
                await done_send.send((scene, image, result))

    async def _fetch_one(self, image: ImageInfo, verify_send) -> FileResult:
        options = self.options
        final = self._final_path(image)
        part = final + ".part"
        attempt = 0
        try:
            os.makedirs(os.path.dirname(final), exist_ok=True)
            reason = "not attempted"
            for attempt in range(1, options.attempts + 1):
                if attempt > 1:
                    self.stats.retries += 1
                    await trio.sleep(options.backoff * 2 ** (attempt - 2))
                try:
                    await self._download(image, part)
                except DownloadError as error:
                    if not error.transient:
                        return FileResult("failed", str(error), attempt)
                    reason = str(error)
                    continue
                reply_send, reply_receive = trio.open_memory_channel(1)
                await verify_send.send((image, part, reply_send))
                digest = await reply_receive.receive()
                if isinstance(digest, OSError):
                    raise digest
                if digest == image.sha1:
                    os.replace(part, final)
                    return FileResult("verified", None, attempt)
                reason = f"SHA-1 mismatch (got {digest}, expected {image.sha1})"
                self._remove(part)
        except OSError as error:
            # disk full, unwritable folder, a directory in the way: this file fails, the others go on
            where = error.filename or part
            return FileResult("failed", f"cannot write {where} ({error.strerror or error})", max(attempt, 1))
        return FileResult("failed", reason, options.attempts)

    async def _download(self, image: ImageInfo, part: str) -> None:
        assert self.client is not None
        offset = os.path.getsize(part) if os.path.exists(part) else 0
        if image.size is not None and offset > image.size:
            self._remove(part)
            offset = 0
        if image.size is not None and offset == image.size:
            return  # a complete .part from an interrupted run: verify it
        url = f"{self.base}/api/access/datafile/{image.file_id}"
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        progress = self.stats.active.setdefault(image.filename, [offset, image.size or 0])
        progress[0] = offset
        try:
            async with self.client.stream("GET", url, headers=headers) as response:
                status = response.status_code
                if status in PERMANENT_STATUSES:
                    raise DownloadError(f"HTTP {status} from {url}", transient=False)
                if status == 416:
                    self._remove(part)
                    raise DownloadError(f"HTTP 416 for Range bytes={offset}- (restarting from zero)", transient=True)
                if status != 200 and status != 206:
                    raise DownloadError(f"HTTP {status} from {url}", transient=True)
                mode = "ab"
                if status == 200:
                    self._grow(-offset)  # the part is truncated below
                    mode, offset = "wb", 0  # the server ignored the Range: start over
                else:
                    content_range = response.headers.get("Content-Range", "")
                    if not content_range.startswith(f"bytes {offset}-"):
                        self._remove(part)
                        raise DownloadError(f"unexpected Content-Range {content_range!r} for offset {offset}", transient=True)
                progress[0] = offset
                with open(part, mode) as handle:
                    async for chunk in response.aiter_raw():
                        handle.write(chunk)
                        self._grow(len(chunk))
                        progress[0] += len(chunk)
                        self.progress.advance(0, len(chunk))
        except httpx.HTTPError as error:
            raise DownloadError(f"{type(error).__name__}: {error}", transient=True) from None
        finally:
            self.stats.active.pop(image.filename, None)
        size = os.path.getsize(part)
        if image.size is not None and size != image.size:
            raise DownloadError(f"short body ({size} of {image.size} bytes)", transient=True)

    async def _verifier(self, requests) -> None:
        async with requests:
            async for image, path, reply in requests:
                began = time.perf_counter()
                try:
                    digest = await trio.to_thread.run_sync(sha1_file, path)
                    self.stats.bytes_hashed += os.path.getsize(path)
                except OSError as error:  # handed to the download task, which reports the file
                    digest = error
                self.stats.hash_seconds += time.perf_counter() - began
                await reply.send(digest)

    async def _indexer(self, receive, scene_send) -> None:
        pending: dict[str, list] = {}
        async with receive, scene_send:
            async for scene, image, result in receive:
                self._record(image, result)
                state = pending.setdefault(scene.key, [len(scene.files), True])
                state[0] -= 1
                if image.role != "sidecar" and result.status not in ("present", "verified"):
                    state[1] = False
                if state[0] == 0:
                    del pending[scene.key]
                    if state[1]:
                        self.stats.scenes_complete += 1
                        await scene_send.send(scene)
                    else:
                        self.stats.scenes_incomplete += 1
                        if self.converter is not None:
                            self._release(scene)  # its files stay for a re-run, outside the bound
                        missing = [
                            image.filename
                            for image in scene.images
                            if self.results.get(image.filename, {}).get("status") not in ("present", "verified")
                        ]
                        self.incomplete_scenes.append({"scene": scene.key, "missing": missing})

    def _record(self, image: ImageInfo, result: FileResult) -> None:
        entry = {"status": result.status, "scene": f"{image.cfa}/{image.scene}", "role": image.role}
        if result.reason:
            entry["reason"] = result.reason
        if result.attempts:
            entry["attempts"] = result.attempts
        self.results[image.filename] = entry
        self.progress.advance(1)
        if result.status == "present":
            self.stats.present += 1
        elif result.status == "verified":
            self.stats.verified += 1
        elif result.status == "unmatched":
            self.stats.unmatched += 1
        else:
            self.stats.failed += 1

    async def _metadata_worker(self, receive, limiter: trio.CapacityLimiter) -> None:
        from ..metadata import scene_metadata

        async with receive:
            async for scene in receive:
                if not self.options.metadata:
                    continue
                clean = [(self._final_path(image), image.sha1) for image in scene.clean]
                noisy = [(self._final_path(image), image.sha1) for image in scene.noisy]
                try:
                    _, computed = await trio.to_thread.run_sync(
                        scene_metadata, clean, noisy, self.metadata_cache, limiter=limiter
                    )
                except Exception as error:  # noqa: BLE001 - one bad scene must not stop the others
                    reason = str(error) if isinstance(error, InputError) else f"{type(error).__name__}: {error}"
                    self.metadata_problems.append({"scene": scene.key, "reason": reason})
                    continue
                self.stats.metadata_done += 1
                self.stats.pairs_computed += computed

    async def _convert_worker(self, receive, limiter: trio.CapacityLimiter) -> None:
        async with receive:
            async for scene in receive:
                try:
                    if self.converter.converts(scene):
                        await trio.to_thread.run_sync(self.converter.convert, scene, limiter=limiter)
                        self.stats.scenes_converted += 1
                    if not self.options.keep_raw:
                        self._remove_scene_raws(scene)
                except Exception as error:  # noqa: BLE001 - one bad scene must not stop the others
                    reason = str(error) if isinstance(error, WdsprepError) else f"{type(error).__name__}: {error}"
                    self.convert_problems.append({"scene": scene.key, "reason": reason})  # raws kept for a re-run
                finally:
                    self._release(scene)

    # -------------------------------------------------------------------------------- progress
    def _progress_line(self, progress: Progress) -> str:
        """The fetch's own progress line; on a terminal with the active transfers' percentages."""
        stats = self.stats
        line = (
            f"files {progress.items}/{progress.total_items} (present {stats.present}, verified {stats.verified}, "
            f"failed {stats.failed}) | {human_bytes(progress.bytes)}/{human_bytes(progress.total_bytes)} "
            f"| {human_bytes(progress.rate)}/s | active {len(stats.active)} | retries {stats.retries} "
            f"| scenes {stats.scenes_complete}/{stats.scenes_total} | metadata {stats.metadata_done}"
            + (f" | converted {stats.scenes_converted} | raw on disk {human_bytes(self.raw_bytes)}" if self.converter else "")
        )
        active = ", ".join(
            f"{name[:24]} {100 * done // max(total, 1)}%" for name, (done, total) in list(stats.active.items())[:5]
        )
        return line + (f" [{active}]" if active and progress.mode == "bar" else "")

    async def _progress_loop(self) -> None:
        """Draws while no byte arrives too (a stalled server, retries waiting out their backoff)."""
        while self.progress.enabled:
            await trio.sleep(self.progress.every)
            self.progress.refresh()

    # ------------------------------------------------------------------------------------- run
    async def run(self) -> dict[str, Any]:
        options = self.options
        if options.concurrency < 1 or options.attempts < 1:
            raise FetchError("--concurrency and --attempts must be at least 1")
        if options.convert and options.driver is None:
            raise FetchError("--convert needs the conversion driver: FetchOptions(driver=wdsprep.Conversion)")
        if not options.dry_run:
            self._check_destination()
        timeout = httpx.Timeout(options.timeout, connect=min(options.timeout, 10.0))
        limits = httpx.Limits(max_connections=options.concurrency + 2, max_keepalive_connections=options.concurrency + 2)
        async with httpx.AsyncClient(timeout=timeout, limits=limits, follow_redirects=True) as client:
            self.client = client
            if self.base and options.listing and not options.dry_run:
                await self._probe_server()
            listing, listing_raw = await self._load_listing()
            index, index_raw = await self._load_index(listing)
            scenes = build_scenes(index, listing, cfa=options.cfa, scenes=options.scenes, max_scenes=options.max_scenes)
            if options.scenes:
                known = {scene.name for scene in scenes} | {scene.key for scene in scenes}
                unknown = [name for name in options.scenes if name not in known]
                if unknown:
                    raise FetchError(f"scenes not in the index: {', '.join(unknown)}")
            summary = plan_summary(scenes, listing)
            if options.dry_run:
                summary["already_present"] = sum(
                    1 for scene in scenes for image in scene.files
                    if image.downloadable and os.path.isfile(self._final_path(image))
                )
                return {"dry_run": True, **summary}
            with open(os.path.join(options.dest, INDEX_FILENAME), "wb") as handle:
                handle.write(index_raw)
            if listing_raw is not None:
                with open(os.path.join(options.dest, LISTING_FILENAME), "wb") as handle:
                    handle.write(listing_raw)
            if options.convert:
                scenes = await self._start_conversion(scenes)
            elif options.metadata:
                from ..metadata import MetadataCache

                self.metadata_cache = MetadataCache(options.dest)
            self.stats.scenes_total = len(scenes)
            to_download = sum(
                max(0, (image.size or 0) - (os.path.getsize(self._final_path(image)) if os.path.isfile(self._final_path(image)) else 0))
                for scene in scenes for image in scene.files if image.downloadable
            )
            self.progress = Progress("[rawnind fetch]", summary["index_entries"], to_download, stream=self.stream,
                                     mode=options.progress, every=options.log_interval, line=self._progress_line)
            async with trio.open_nursery() as outer:
                outer.start_soon(self._progress_loop)
                await self._pipeline(scenes)
                outer.cancel_scope.cancel()
            manifest = None
            if self.converter is not None:
                began = time.time() - (time.monotonic() - self.started)
                manifest = await trio.to_thread.run_sync(self.converter.finish, self.all_scenes, began)
        report = self._report(summary)
        if self.converter is not None:
            report["convert"] = {
                "output": self.converter.store.url,
                "manifest": manifest.url if manifest is not None else None,
                "scenes_converted": self.stats.scenes_converted,
                "scenes_converted_before": self.converted_before,
                "problems": self.convert_problems,
                "keep_raw": options.keep_raw,
                "max_raw_bytes": options.max_raw_bytes,
                "raw_bytes_peak": self.raw_peak,
            }
            self._write_report(report)
        self.progress.close()
        return report

    async def _start_conversion(self, scenes: list[SceneInfo]) -> list[SceneInfo]:
        """Open the output, drop scenes an earlier run converted (and their leftover raws), count the
        raws already on disk; returns the scenes still to fetch and convert."""
        from ..streamconvert import SceneConverter

        options = self.options
        self.all_scenes = scenes
        self.converter = await trio.to_thread.run_sync(
            lambda: SceneConverter(options.driver, options.convert, options.dest, scenes, options.convert_options))
        self._released = trio.Event()
        todo = []
        for scene in scenes:
            files = [path for image in scene.files for path in (self._final_path(image), self._final_path(image) + ".part")]
            self._grow(sum(os.path.getsize(path) for path in files if os.path.isfile(path)))
            if self.converter.converts(scene) and await trio.to_thread.run_sync(self.converter.record, scene) is not None:
                self.converted_before.append(scene.key)
                if not options.keep_raw:
                    self._remove_scene_raws(scene)  # a run killed after the record, before the removal
                continue
            self.scene_bytes[scene.key] = sum(image.size or 0 for image in scene.files if image.downloadable)
            todo.append(scene)
        self.raw_peak = self.raw_bytes
        return todo

    async def _pipeline(self, scenes: list[SceneInfo]) -> None:
        size = self.options.channel_size
        ingest_send, ingest_receive = trio.open_memory_channel(size)
        download_send, download_receive = trio.open_memory_channel(size)
        verify_send, verify_receive = trio.open_memory_channel(size)
        done_send, done_receive = trio.open_memory_channel(size)
        scene_send, scene_receive = trio.open_memory_channel(size)
        limiter = trio.CapacityLimiter(self.options.metadata_workers)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._ingest, scenes, ingest_send)
            nursery.start_soon(self._scan, ingest_receive, download_send, done_send.clone())
            for _ in range(self.options.concurrency):
                nursery.start_soon(self._download_worker, download_receive.clone(), verify_send.clone(), done_send.clone())
            nursery.start_soon(self._verifier, verify_receive)
            nursery.start_soon(self._indexer, done_receive, scene_send)
            worker = self._convert_worker if self.converter is not None else self._metadata_worker
            for _ in range(self.options.metadata_workers):
                nursery.start_soon(worker, scene_receive.clone(), limiter)
            # the stages hold clones; closing the originals lets each channel close with its users
            for channel in (download_receive, verify_send, done_send, scene_receive):
                await channel.aclose()

    def _report(self, summary: dict) -> dict[str, Any]:
        stats = self.stats
        by_status: dict[str, list] = {"verified": [], "skipped": [], "failed": [], "unmatched": []}
        for name, entry in sorted(self.results.items()):
            if entry["status"] == "verified":
                by_status["verified"].append(name)
            elif entry["status"] == "present":
                by_status["skipped"].append(name)
            elif entry["status"] == "unmatched":
                by_status["unmatched"].append(name)
            else:
                by_status["failed"].append({"file": name, "reason": entry.get("reason"), "attempts": entry.get("attempts", 0)})
        elapsed = time.monotonic() - self.started
        report = {
            "dest": os.path.abspath(self.options.dest),
            "dataverse": self.base or None,
            "doi": self.options.doi,
            **by_status,
            "scenes": {"total": stats.scenes_total, "complete": stats.scenes_complete, "incomplete": self.incomplete_scenes},
            "metadata": {"scenes": stats.metadata_done, "pairs_computed": stats.pairs_computed, "problems": self.metadata_problems},
            "bytes_downloaded": self.progress.bytes,
            "retries": stats.retries,
            "elapsed_s": round(elapsed, 3),
            "download_rate_bps": round(self.progress.bytes / max(elapsed, 1e-9)),
            "sha1_rate_bps": round(stats.bytes_hashed / stats.hash_seconds) if stats.hash_seconds else None,
            "plan": {key: value for key, value in summary.items() if key not in ("unmatched", "listing_not_in_index")},
        }
        self._write_report(report)
        return report

    def _write_report(self, report: dict) -> None:
        path = self.options.report or os.path.join(self.options.dest, "fetch_report.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1)


def fetch(options: FetchOptions) -> dict[str, Any]:
    """Run the acquisition pipeline to completion; returns the report (also written as JSON)."""
    return trio.run(Fetcher(options).run)
