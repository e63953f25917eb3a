"""The RawNIND index YAML and the Dataverse file listing, read and matched (DataIngestor's job).

The real index (`dataset.yaml` on Dataverse, cached as `dataset_index.yaml`) maps
`{CFA: {scene: {clean_images, noisy_images, test_reserve, unknown_sensor}}}` and holds only file
names and SHA-1s; sizes, MD5s and the file ids that make download URLs come from the Dataverse
dataset JSON (`data.latestVersion.files[].dataFile`). Files are matched by name. Scene membership
comes from the YAML, never from parsing file names (scene names contain `_`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from ...errors import InputError
from ..base import MAX_JSON_BYTES, MAX_YAML_BYTES, parse_json, parse_yaml, read_input_bytes

SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
SIDECAR_EXTENSIONS = (".xmp",)
INDEX_FILENAME = "dataset_index.yaml"  # local cache name used by the fork's DataIngestor
LISTING_FILENAME = "dataset_metadata.json"
DATAVERSE_INDEX_NAME = "dataset.yaml"  # the index's file name on Dataverse
DEFAULT_DOI = "doi:10.14428/DVN/DEQCIM"


@dataclass(frozen=True)
class RemoteFile:
    """One `dataFile` of the Dataverse listing."""

    id: int
    filename: str
    size: int
    md5: str | None = None
    persistent_id: str | None = None


@dataclass(frozen=True)
class ImageInfo:
    cfa: str
    scene: str
    filename: str
    sha1: str
    role: str  # "clean" | "noisy" | "sidecar"
    file_id: int | None = None
    size: int | None = None

    @property
    def relpath(self) -> str:
        """Local layout of FileScanner / organize_files.sh: clean captures under `gt/`."""
        if self.role == "clean":
            return f"{self.cfa}/{self.scene}/gt/{self.filename}"
        return f"{self.cfa}/{self.scene}/{self.filename}"

    @property
    def downloadable(self) -> bool:
        return self.file_id is not None


@dataclass
class SceneInfo:
    cfa: str
    name: str
    clean: list[ImageInfo]
    noisy: list[ImageInfo]
    sidecars: list[ImageInfo] = field(default_factory=list)
    test_reserve: bool = False
    unknown_sensor: bool = False

    @property
    def key(self) -> str:
        return f"{self.cfa}/{self.name}"

    @property
    def images(self) -> list[ImageInfo]:
        """The captures a scene needs to be complete (sidecars are optional)."""
        return self.clean + self.noisy

    @property
    def files(self) -> list[ImageInfo]:
        return self.clean + self.noisy + self.sidecars


def parse_index(text: str | bytes, source: str) -> dict[str, dict[str, dict]]:
    """Parse and validate the index YAML; errors name `source`, the scene and the rule."""
    data = parse_yaml(text, source)  # a scene given twice, or an alias bomb, is refused
    if not isinstance(data, dict) or not data:
        raise InputError(f"{source}: expected a mapping of CFA type to scenes at the top level")
    for cfa, scenes in data.items():
        if not isinstance(scenes, dict):
            raise InputError(f"{source}: {cfa}: expected a mapping of scene name to scene")
        for name, scene in scenes.items():
            where = f"{source}: {cfa}/{name}"
            if not isinstance(scene, dict):
                raise InputError(f"{where}: expected a mapping with clean_images and noisy_images")
            for kind in ("clean_images", "noisy_images"):
                entries = scene.get(kind)
                if not isinstance(entries, list):
                    raise InputError(f"{where}: missing list {kind!r}")
                for position, entry in enumerate(entries):
                    if not isinstance(entry, dict) or "filename" not in entry or "sha1" not in entry:
                        raise InputError(f"{where}: {kind}[{position}]: expected filename and sha1")
                    sha1 = str(entry["sha1"])
                    if not SHA1_RE.match(sha1):
                        raise InputError(f"{where}: {kind}[{position}]: sha1 {sha1!r} is not 40 hex digits")
                    filename = str(entry["filename"])
                    if "/" in filename or filename in ("", ".", ".."):
                        raise InputError(f"{where}: {kind}[{position}]: bad file name {filename!r}")
            if not scene["clean_images"]:
                raise InputError(f"{where}: no clean_images")
    return data


def load_index(path: str) -> dict[str, dict[str, dict]]:
    return parse_index(read_input_bytes(path, MAX_YAML_BYTES, "an index"), path)


def parse_listing(data: bytes | str | dict, source: str) -> dict[str, RemoteFile]:
    """Dataverse dataset JSON -> {filename: RemoteFile}."""
    if not isinstance(data, dict):
        data = parse_json(data, source)  # a file named twice in one object is refused
    try:
        files = data["data"]["latestVersion"]["files"]
    except (KeyError, TypeError):
        raise InputError(f"{source}: not a Dataverse dataset (no data.latestVersion.files)") from None
    listing: dict[str, RemoteFile] = {}
    for position, entry in enumerate(files):
        try:
            datafile = entry["dataFile"]
            remote = RemoteFile(
                id=int(datafile["id"]),
                filename=str(datafile.get("filename") or entry["label"]),
                size=int(datafile["filesize"]),
                md5=(datafile.get("checksum") or {}).get("value") or datafile.get("md5"),
                persistent_id=datafile.get("persistentId"),
            )
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{source}: files[{position}]: expected dataFile with id, filename, filesize") from None
        listing[remote.filename] = remote
    return listing


def load_listing(path: str) -> dict[str, RemoteFile]:
    return parse_listing(read_input_bytes(path, MAX_JSON_BYTES, "a Dataverse listing"), path)


def build_scenes(
    index: dict[str, dict[str, dict]],
    listing: dict[str, RemoteFile] | None,
    *,
    cfa: str | None = None,
    scenes: Iterable[str] | None = None,
    max_scenes: int | None = None,
) -> list[SceneInfo]:
    """SceneInfo objects in index order, filtered; `.xmp` entries become sidecars."""
    wanted = set(scenes) if scenes else None
    out: list[SceneInfo] = []
    for cfa_name, scene_map in index.items():
        if cfa is not None and cfa_name.lower() != cfa.lower():
            continue
        for name, scene in scene_map.items():
            if wanted is not None and name not in wanted and f"{cfa_name}/{name}" not in wanted:
                continue
            info = SceneInfo(
                cfa=cfa_name,
                name=str(name),
                clean=[],
                noisy=[],
                test_reserve=bool(scene.get("test_reserve", False)),
                unknown_sensor=bool(scene.get("unknown_sensor", False)),
            )
            for kind, role in (("clean_images", "clean"), ("noisy_images", "noisy")):
                for entry in scene[kind]:
                    filename = str(entry["filename"])
                    remote = listing.get(filename) if listing is not None else None
                    is_sidecar = filename.lower().endswith(SIDECAR_EXTENSIONS)
                    image = ImageInfo(
                        cfa=cfa_name,
                        scene=info.name,
                        filename=filename,
                        sha1=str(entry["sha1"]),
                        role="sidecar" if is_sidecar else role,
                        file_id=remote.id if remote else None,
                        size=remote.size if remote else None,
                    )
                    if is_sidecar:
                        info.sidecars.append(image)
                    elif role == "clean":
                        info.clean.append(image)
                    else:
                        info.noisy.append(image)
            out.append(info)
            if max_scenes is not None and len(out) >= max_scenes:
                return out
    return out


def plan_summary(scenes: list[SceneInfo], listing: dict[str, RemoteFile] | None) -> dict[str, Any]:
    """What a fetch would do: counts, bytes, and index entries with no Dataverse id."""
    files = [image for scene in scenes for image in scene.files]
    matched = [image for image in files if image.downloadable]
    unmatched = [image.filename for image in files if not image.downloadable]
    summary: dict[str, Any] = {
        "scenes": len(scenes),
        "scenes_by_cfa": {},
        "index_entries": len(files),
        "files": len(matched),
        "bytes": sum(image.size or 0 for image in matched),
        "clean": sum(len(scene.clean) for scene in scenes),
        "noisy": sum(len(scene.noisy) for scene in scenes),
        "sidecars": sum(len(scene.sidecars) for scene in scenes),
        "unmatched": unmatched,
        "test_reserve_scenes": sum(scene.test_reserve for scene in scenes),
    }
    for scene in scenes:
        summary["scenes_by_cfa"][scene.cfa] = summary["scenes_by_cfa"].get(scene.cfa, 0) + 1
    if listing is not None:
        names = {image.filename for image in files}
        summary["listing_files"] = len(listing)
        summary["listing_bytes"] = sum(remote.size for remote in listing.values())
        summary["listing_not_in_index"] = sorted(name for name in listing if name not in names)
    return summary
