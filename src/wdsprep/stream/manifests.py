"""Loading manifests and shard URLs from any location."""
from __future__ import annotations

from ..errors import ConfigError, ManifestError, ShardError
from ..shards.manifest import MANIFEST_NAME, Manifest
from ..storage import local_path, read_url, scheme_of


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


def local_shard_paths(location, split: str = "train") -> list[str]:
    """Local file paths of a split's shards, for map-style (random access) datasets.

    `location` is a local manifest (file or directory), a single `.tar`, or a list of tar paths.
    """
    import os

    if not isinstance(location, (str, os.PathLike)):
        paths = [str(path) for path in location]
        if not paths:
            raise ConfigError("no shards given")
        return paths
    location = str(location)
    if location.endswith(".tar"):
        return [location]
    manifest = load_manifest(location)
    paths = []
    for url in manifest.shard_urls(split):
        path = local_path(url)
        if path is None:
            raise ConfigError(f"{url}: map-style datasets read local shards; stream remote ones with the reader stage")
        paths.append(path)
    return paths
