"""The `SOURCE` object the core talks to, and the `prepare_input` hook of `make shards`."""
from __future__ import annotations

import argparse
import json
import os
from typing import Iterator

from ..base import Plan, Unit, UnitContext
from . import convert as _convert


class RawNINDSource:
    id = "rawnind"
    fingerprint = "stat"  # raw captures are tens of MB each: content hashing would read them twice

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _convert.add_arguments(parser)

    def plan(self, input: str, options: dict) -> Plan:
        return _convert.plan(input, options)

    def inputs(self, item: dict) -> list[str]:
        return _convert.item_inputs(item)

    def build(self, unit: Unit, ctx: UnitContext) -> Iterator[tuple[str, dict]]:
        return _convert.build(unit, ctx)

    def finalize(self, plan: Plan, unit_tables) -> dict:
        return _convert.finalize(plan, unit_tables)

    def synth(self, directory: str, seed: int = 0, size: str = "small") -> None:
        from .synth import synth

        synth(directory, seed, size)

    def prepare_input(self, pipeline: dict, workdir: str) -> str:
        """synth a Dataverse directory -> serve it on 127.0.0.1 -> fetch through it -> the fetched dir.

        The pipeline's `[prepare]` table: `server_dir` (default `<workdir>/rawnind_dataverse`),
        `seed`, `size`, `concurrency`. A fetched directory whose report shows no failure is reused.
        """
        from .fetch import FetchOptions, fetch
        from .server import DataverseServer
        from .synth import synth

        settings = dict(pipeline.get("prepare", {}))
        dest = pipeline["input"]
        server_dir = settings.get("server_dir") or os.path.join(workdir, "rawnind_dataverse")
        if not os.path.isabs(server_dir):
            server_dir = os.path.join(os.path.dirname(os.path.abspath(workdir)), server_dir)
        if not os.path.exists(os.path.join(server_dir, "dataverse_dataset.json")):
            print(f"[rawnind] synthesizing a Dataverse directory in {server_dir}", flush=True)
            synth(server_dir, int(settings.get("seed", 0)), settings.get("size", "small"))
        with DataverseServer(server_dir) as server:
            print(f"[rawnind] serving {server_dir} at {server.url}; fetching into {dest}", flush=True)
            report = fetch(FetchOptions(
                dest=dest, dataverse=server.url, doi=server.doi,
                concurrency=int(settings.get("concurrency", 5)), progress="log", log_interval=5.0,
            ))
        if report["failed"]:
            raise RuntimeError(f"rawnind fetch failed for {len(report['failed'])} files: "
                               + json.dumps(report["failed"][:3]))
        return dest


SOURCE = RawNINDSource()
