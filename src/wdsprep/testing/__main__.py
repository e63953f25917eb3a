"""Run a test service in the foreground: `python -m wdsprep.testing s3` or `... http DIR`.

Prints one line, the endpoint (for s3 also the shell exports to use it), then serves until stdin
closes or the process is interrupted. Used by the benchmark (a server in its own process, like a
real one) and handy for trying `wdsprep upload` and streaming without cloud credentials.
"""
from __future__ import annotations

import argparse
import sys

from . import RangeHTTPServer, S3Server


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wdsprep.testing")
    parser.add_argument("service", choices=("s3", "http"))
    parser.add_argument("root", nargs="?", help="http: the directory to serve")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--bucket", action="append", default=[], help="s3: create this bucket (repeatable)")
    args = parser.parse_args(argv)
    if args.service == "s3":
        server = S3Server(port=args.port).start()
        for name in args.bucket:
            server.create_bucket(name)
        exports = " ".join(f"{k}={v}" for k, v in server.env.items() if not k.lower().startswith("no_proxy"))
        print(f"{server.endpoint} export {exports}", flush=True)
    else:
        if not args.root:
            parser.error("http needs the directory to serve")
        server = RangeHTTPServer(args.root, port=args.port).start()
        print(server.url, flush=True)
    try:
        sys.stdin.read()  # until the parent closes our stdin
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
