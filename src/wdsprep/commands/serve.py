"""`wdsprep serve dataverse DIR`: a local Dataverse-compatible server of a directory, in the
foreground until Ctrl-C (`wdsprep.testing.DataverseServer`: what `wdsprep fetch rawnind` can be
tried against, with the faults of a fault file). One line when it is up: `serving DIR as DOI at
URL`; a directory that is no Dataverse dataset, an unreadable fault table or an address that cannot
be bound is one `wdsprep: error:` line."""
from __future__ import annotations

import argparse
import json

from ..checks import number, whole_number
from ..command import Command, checked
from ..errors import ConfigError, InputError
from ..testing.dataverse import DataverseServer, Faults


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="directory with dataverse_dataset.json and the files it lists")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=checked(whole_number, 0, maximum=65535), default=8080,
                        help="port (0 picks a free one)")
    parser.add_argument("--rate-limit", type=checked(number, 0, above=True), default=None, metavar="BYTES_PER_S",
                        help="limit each connection to this many bytes per second")
    parser.add_argument("--faults", default=None, metavar="JSON", help="fault injection table (JSON file)")
    parser.add_argument("--log", default=None, metavar="PATH", help="append one JSON line per request here")


def run(args: argparse.Namespace) -> int:
    faults = Faults()
    if args.faults:
        try:
            with open(args.faults, encoding="utf-8") as handle:
                faults = Faults.from_json(json.load(handle))
        except (OSError, ValueError, TypeError) as error:
            raise ConfigError(f"{args.faults}: cannot read the fault table ({error})") from None
    if args.rate_limit:
        faults.rate_limit = args.rate_limit
    try:
        server = DataverseServer(args.directory, host=args.host, port=args.port, faults=faults, log_path=args.log)
    except ValueError as error:
        raise InputError(str(error)) from None
    except OSError as error:
        raise ConfigError(f"--host {args.host} --port {args.port}: cannot listen ({error.strerror or error})") from None
    print(f"serving {server.directory.root} as {server.doi} at {server.url}", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
    return 0


COMMAND = Command("serve dataverse", "a local Dataverse-compatible server", add_arguments, run, usage="DIR")
