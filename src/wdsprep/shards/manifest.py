"""`manifest.json`: what a shard directory holds, and the key to counts, verification and resume."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import ManifestError

FORMAT = "wdsprep/1"
MANIFEST_VERSION = 1
MANIFEST_NAME = "manifest.json"


@dataclass
class Manifest:
    source: str
    config: dict
    fingerprint: str
    splits: dict[str, list[dict]]  # split -> shard rows {name, samples, bytes, sha256, unit, unit_digest}
    tables: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    input_bytes: int = 0
    timing: dict = field(default_factory=dict)  # informational; excluded from comparisons
    url: str | None = None  # where it was loaded from (not serialized)

    # -- derived
    def shards(self, split: str) -> list[dict]:
        if split not in self.splits:
            known = ", ".join(sorted(self.splits)) or "none"
            where = f" in {self.url}" if self.url else ""
            raise ManifestError(f"no split {split!r}{where} (splits: {known})")
        return self.splits[split]

    def samples(self, split: str | None = None) -> int:
        splits = [split] if split else list(self.splits)
        return sum(row["samples"] for s in splits for row in self.shards(s))

    def bytes(self, split: str | None = None) -> int:
        splits = [split] if split else list(self.splits)
        return sum(row["bytes"] for s in splits for row in self.shards(s))

    def shard_urls(self, split: str) -> list[str]:
        base = self.base_url()
        return [join_url(base, row["name"]) for row in self.shards(split)]

    def base_url(self) -> str:
        if not self.url:
            raise ManifestError("manifest was not loaded from a location; shard URLs are unknown")
        return self.url.rsplit("/", 1)[0] if "/" in self.url else "."

    # -- serialization
    def to_dict(self) -> dict:
        split_totals = {
            split: {"shards": rows, "samples": sum(r["samples"] for r in rows), "bytes": sum(r["bytes"] for r in rows)}
            for split, rows in sorted(self.splits.items())
        }
        return {
            "format": FORMAT,
            "manifest_version": MANIFEST_VERSION,
            "source": self.source,
            "config": self.config,
            "fingerprint": self.fingerprint,
            "input_bytes": self.input_bytes,
            "splits": split_totals,
            "totals": {
                "shards": sum(len(rows) for rows in self.splits.values()),
                "samples": self.samples(),
                "bytes": self.bytes(),
            },
            "tables": self.tables,
            "problems": self.problems,
            "timing": self.timing,
        }

    def dumps(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_dict(cls, data: dict, url: str | None = None) -> "Manifest":
        where = url or "manifest"
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ManifestError(f"{where}: not a {FORMAT} manifest (format={data.get('format') if isinstance(data, dict) else None!r})")
        version = data.get("manifest_version")
        if version != MANIFEST_VERSION:
            raise ManifestError(
                f"{where}: manifest version {version!r} is not supported by this wdsprep "
                f"(it reads version {MANIFEST_VERSION}); upgrade wdsprep or re-convert"
            )
        try:
            splits = {name: list(split["shards"]) for name, split in data["splits"].items()}
            return cls(
                source=data["source"],
                config=data["config"],
                fingerprint=data["fingerprint"],
                splits=splits,
                tables=data.get("tables", {}),
                problems=data.get("problems", []),
                input_bytes=data.get("input_bytes", 0),
                timing=data.get("timing", {}),
                url=url,
            )
        except (KeyError, TypeError, AttributeError) as error:
            raise ManifestError(f"{where}: malformed manifest ({error!r})") from None

    @classmethod
    def loads(cls, text: bytes | str, url: str | None = None) -> "Manifest":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ManifestError(f"{url or 'manifest'}: not valid JSON ({error})") from None
        return cls.from_dict(data, url)


def join_url(base: str, name: str) -> str:
    return name if base in ("", ".") else f"{base.rstrip('/')}/{name}"


def comparable(manifest: dict | Manifest) -> dict[str, Any]:
    """The manifest without its timing fields: equal for equal inputs on any machine or executor."""
    data = manifest.to_dict() if isinstance(manifest, Manifest) else dict(manifest)
    data.pop("timing", None)
    return data
