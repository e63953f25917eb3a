"""`wdsprep pipeline pipelines/X.toml`: one declared step per dataset, what `make shards` runs.

A spec names its `source`, `input` and `output` (relative to the repository, the spec folder's
parent), the conversion's options (`[convert]`, `[options]`) and how its input is made when it is
not there and no `--input` is given:
- `[synth]` (`seed`, `size`): the source's synthetic data, written into `input` (`Source.synth`);
- `[prepare]` (`server_dir`, `seed`, `size`, `concurrency`): `prepare_input`, the source's data
  synthesized as a Dataverse directory, served on 127.0.0.1 by the test server
  (`wdsprep.testing.DataverseServer`) and fetched into `input` through the source's own
  `fetch <source>` command (rawnind: synth -> serve -> fetch, the whole acquisition path).
Then the input is converted (`conversion.convert`) and the summary printed as `wdsprep convert`
prints it. The preparation lives here, with the pipelines: no converter module (which every
conversion worker imports) starts a server or fetches.
"""
from __future__ import annotations

import argparse
import os
import tomllib

from ..checks import whole_number
from ..command import Command, checked
from ..errors import ConversionError
from ..sources.registry import load_source, mounted_commands
from ..testing.dataverse import LISTING_NAME, DataverseServer
from .convert import print_summary


def prepare_input(pipeline: dict, workdir: str) -> str:
    """synth a Dataverse directory -> serve it on 127.0.0.1 -> fetch through it -> the fetched dir.

    `pipeline` is a spec's table with `input` resolved; its `[prepare]` table: `server_dir` (default
    `<workdir>/<source>_dataverse`; a relative one is taken from `workdir`'s parent, the repository),
    `seed`, `size`, `concurrency`. A served directory already written is reused, and so is every file
    the fetch verified before (a second prepare downloads nothing)."""
    source_id = pipeline["source"]
    settings = dict(pipeline.get("prepare", {}))
    dest = pipeline["input"]
    server_dir = settings.get("server_dir") or os.path.join(workdir, f"{source_id}_dataverse")
    if not os.path.isabs(server_dir):
        server_dir = os.path.join(os.path.dirname(os.path.abspath(workdir)), server_dir)
    if not os.path.exists(os.path.join(server_dir, LISTING_NAME)):
        print(f"[{source_id}] synthesizing a Dataverse directory in {server_dir}", flush=True)
        load_source(source_id).synth(server_dir, int(settings.get("seed", 0)), settings.get("size", "small"))
    fetch = _mounted(f"fetch {source_id}")
    with DataverseServer(server_dir) as server:
        print(f"[{source_id}] serving {server_dir} at {server.url}; fetching into {dest}", flush=True)
        args = fetch.parser().parse_args([dest, "--dataverse", server.url, "--doi", server.doi, "--progress", "log",
                                          "--log-interval", "5", "--concurrency", str(int(settings.get("concurrency", 5)))])
        status = fetch.run(args)
    if status:
        raise ConversionError(f"{dest}: preparing the input failed: `wdsprep {fetch.name}` from {server_dir} "
                              f"ended with exit status {status} (see {os.path.join(dest, 'fetch_report.json')})")
    return dest


def _mounted(name: str) -> Command:
    for command in mounted_commands():
        if command.name == name:
            return command
    raise ConversionError(f"a [prepare] table needs the command `wdsprep {name}`, which no source mounts")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec")
    parser.add_argument("--input", help="override the spec's native input (e.g. real data)")
    parser.add_argument("--output", help="override the spec's output")
    parser.add_argument("--workers", type=checked(whole_number, 1), default=None,
                        help="parallel unit builders (default: the spec's, else the conversion's)")


def run(args: argparse.Namespace) -> int:
    from ..conversion import convert

    with open(args.spec, "rb") as handle:
        spec = tomllib.load(handle)
    root = os.path.dirname(os.path.dirname(os.path.abspath(args.spec)))
    source_id = spec["source"]
    input_path = args.input or os.path.join(root, spec["input"])
    output = args.output or os.path.join(root, spec["output"])
    synth = spec.get("synth")
    if not args.input and synth is not None and not os.path.exists(input_path):
        print(f"[{source_id}] synthesizing native data in {input_path}")
        load_source(source_id).synth(input_path, int(synth.get("seed", 0)), synth.get("size", "small"))
    if not args.input and "prepare" in spec:
        input_path = prepare_input(dict(spec, input=input_path), os.path.join(root, "data"))
    options = dict(spec.get("convert", {}))
    options.update(spec.get("options", {}))
    if args.workers is not None:
        options["workers"] = args.workers
    print(f"[{source_id}] converting {input_path} -> {output}")
    manifest = convert(source_id, input_path, output, quiet=args.quiet, **options)
    print_summary(manifest)
    return 0


COMMAND = Command("pipeline", "synth/fetch + convert as one declared step", add_arguments, run,
                  usage="pipelines/X.toml", resumable=True)
