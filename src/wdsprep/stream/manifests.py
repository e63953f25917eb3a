"""Loading manifests and shard URLs from any location."""
from __future__ import annotations

from ..errors import ManifestError, ShardError
from ..shards.manifest import MANIFEST_NAME, Manifest
from ..storage import read_url, scheme_of


def manifest_location(url: str) -> str:
    """Accept the manifest URL itself or the directory/prefix holding it."""
    if url.endswith(".json"):
        return url
    return f"{url.rstrip('/')}/{MANIFEST_NAME}"


def load_manifest(url: str, options=None) -> Manifest:
    """The manifest at `url` (or in the directory/prefix `url`), read with `options` (a dataset's
    `ReadOptions`; None: the environment's, now)."""
    location = manifest_location(str(url))
    try:
        text = read_url(location, options)
    except ShardError as error:
        raise ManifestError(f"{location}: cannot read manifest ({error})") from None
    if scheme_of(location) == "file":
        location = location[len("file://") :]
    return Manifest.loads(text, location)


def urls(manifest_url: str, split: str = "train") -> list[str]:
    """Plain shard URLs of a split, for `wds.WebDataset(urls, ...)`."""
    return load_manifest(manifest_url).shard_urls(split)


def shard_row(url: str, manifests: dict | None = None) -> dict:
    """The manifest row of the shard at `url`, from the `manifest.json` beside it (a conversion writes
    its shards next to their manifest), for a reader that holds a shard's URL but not its row. A
    shard no manifest there lists is a `ShardError`: nothing could check its samples. `manifests`
    (a dict) keeps the manifests loaded, by directory, for the next call."""
    url = str(url)
    base, _, name = url.rpartition("/")
    base = base or "."
    manifest = None if manifests is None else manifests.get(base)
    if manifest is None:
        try:
            manifest = load_manifest(base)
        except ManifestError as error:
            raise ShardError(url, f"no manifest beside it lists it, so its samples cannot be checked ({error})") from None
        if manifests is not None:
            manifests[base] = manifest
    for rows in manifest.splits.values():
        for row in rows:
            if row["name"] == name:
                return row
    raise ShardError(url, f"{manifest.url} does not list it, so its samples cannot be checked")
