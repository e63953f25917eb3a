"""Run a test service in the foreground: `python -m wdsprep.testing s3`, `... http DIR`, or
`... http --upstream URL` (a proxy in front of another server, e.g. the s3 one).

Prints one line, the endpoint (for s3 also the shell exports to use it), then serves until stdin
closes or the process is interrupted. While it runs, a line `stats` on stdin prints the http
server's counts as one JSON line (requests, body bytes sent, connections accepted, most open at
once, most requests answered at once, the client's sequential waits), `clear` forgets them, and `shape RATE TOTAL LATENCY SETUP` reshapes the link (0: unshaped);
each answers one line. `--rate`, `--total`, `--latency`, `--setup` shape the http server's link
from the start (`wdsprep.testing.httpserver.Shaping`). Used by the benchmarks (a server in its own process,
like a real one) and handy for trying `wdsprep upload` and streaming without cloud credentials.
"""
from __future__ import annotations

import argparse
import json
import sys

from . import RangeHTTPServer, S3Server
from .httpserver import Shaping


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wdsprep.testing")
    parser.add_argument("service", choices=("s3", "http"))
    parser.add_argument("root", nargs="?", help="http: the directory to serve")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--bucket", action="append", default=[], help="s3: create this bucket (repeatable)")
    parser.add_argument("--upstream", help="http: forward every request to this server instead of serving files")
    parser.add_argument("--rate", type=float, help="http: bytes/s per connection")
    parser.add_argument("--total", type=float, help="http: bytes/s over all connections")
    parser.add_argument("--latency", type=float, default=0.0, help="http: seconds before each response's first byte")
    parser.add_argument("--setup", type=float, default=0.0, help="http: seconds before a new connection's first request")
    args = parser.parse_args(argv)
    if args.service == "s3":
        server = S3Server(port=args.port).start()
        for name in args.bucket:
            server.create_bucket(name)
        exports = " ".join(f"{k}={v}" for k, v in server.env.items() if not k.lower().startswith("no_proxy"))
        print(f"{server.endpoint} export {exports}", flush=True)
    else:
        if not args.root and not args.upstream:
            parser.error("http needs the directory to serve (or --upstream)")
        shaping = Shaping(args.rate, args.total, args.latency, args.setup)
        server = RangeHTTPServer(args.root, port=args.port, shaping=shaping, upstream=args.upstream).start()
        print(server.url, flush=True)
    try:
        for line in sys.stdin:  # until the parent closes our stdin
            command = line.strip()
            if command == "stats" and isinstance(server, RangeHTTPServer):
                print(json.dumps({**server.stats(), "round_trips": server.round_trips()}), flush=True)
            elif command == "clear" and isinstance(server, RangeHTTPServer):
                server.clear_log()
                print("{}", flush=True)
            elif command.startswith("shape ") and isinstance(server, RangeHTTPServer):
                rate, total, latency, setup = (float(x) for x in command.split()[1:5])
                server.shape(Shaping(rate or None, total or None, latency, setup))
                print("{}", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
