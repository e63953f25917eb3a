"""Loading manifests and shard URLs from any location."""
from __future__ import annotations

from ..errors import ManifestError, ShardError
from ..shards.manifest import MANIFEST_NAME, Manifest
from .opener import read_url, scheme_of


def manifest_location(url: str) -> str:
    """Accept the manifest URL itself or the directory/prefix holding it."""
    if url.endswith(".json"):
        return url
    return f"{url.rstrip('/')}/{MANIFEST_NAME}"


def load_manifest(url: str) -> Manifest:
    location = manifest_location(str(url))
    try:
        text = read_url(location)
    except ShardError as error:
        raise ManifestError(f"{location}: cannot read manifest ({error})") from None
    if scheme_of(location) == "file":
        location = location[len("file://") :]
    return Manifest.loads(text, location)


def urls(manifest_url: str, split: str = "train") -> list[str]:
    """Plain shard URLs of a split, for `wds.WebDataset(urls, ...)`."""
    return load_manifest(manifest_url).shard_urls(split)
