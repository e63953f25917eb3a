"""`wdsprep upload SHARD_DIR URL`: copy a converted shard directory to a store, verified, manifest last
(the order of events is `wdsprep.upload`'s)."""
from __future__ import annotations

import argparse

from ..command import Command
from ..storage import describe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shard_dir", help="a local directory written by `wdsprep convert` (holds manifest.json)")
    parser.add_argument("url", help=f"destination: {describe(writable=True)} (s3: endpoint from AWS_ENDPOINT_URL)")
    parser.add_argument("--workers", type=int, default=4, help="shards uploaded at the same time (default 4)")
    parser.add_argument("--verify", choices=("content", "metadata"), default="content",
                        help="after upload, re-read and hash each shard (content, default) or trust size + stored sha256")
    parser.add_argument("--recheck", action="store_true",
                        help="also re-read and hash shards already at the destination before skipping them")
    parser.add_argument("--retries", type=int, default=3, help="attempts per shard after the first (default 3)")
    parser.add_argument("--multipart-bytes", default="64MB", help="S3: shards above this size use a multipart upload")
    parser.add_argument("--part-bytes", default="16MB", help="S3: multipart part size (S3 needs at least 5MiB)")


def run(args: argparse.Namespace) -> int:
    from ..sizes import parse_size
    from ..upload import upload

    report = upload(args.shard_dir, args.url, workers=args.workers, verify=args.verify, recheck=args.recheck,
                    retries=args.retries, multipart_bytes=parse_size(args.multipart_bytes),
                    part_bytes=parse_size(args.part_bytes), quiet=args.quiet)
    print(report.summary())
    return 0


COMMAND = Command("upload", f"copy shards to {describe(writable=True)}; verified, manifest last", add_arguments, run,
                  usage="SHARD_DIR URL", resumable=True)
