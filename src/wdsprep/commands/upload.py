"""`wdsprep upload SHARD_DIR URL`: copy a converted shard directory to a store, verified, manifest last
(the order of events is `wdsprep.upload`'s)."""
from __future__ import annotations

import argparse

from ..checks import size, whole_number
from ..command import Command, checked
from ..readoptions import MAX_S3_PART_BYTES, MIN_S3_PART_BYTES
from ..storage import check_url, describe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shard_dir", help="a local directory written by `wdsprep convert` (holds manifest.json)")
    parser.add_argument("url", help=f"destination: {describe(writable=True)} (s3: endpoint from AWS_ENDPOINT_URL)")
    parser.add_argument("--workers", type=checked(whole_number, 1), default=4,
                        help="shards uploaded at the same time (default 4)")
    parser.add_argument("--verify", choices=("content", "metadata"), default="content",
                        help="after upload, re-read and hash each shard (content, default) or trust size + stored sha256")
    parser.add_argument("--recheck", action="store_true",
                        help="also re-read and hash shards already at the destination before skipping them")
    parser.add_argument("--retries", type=checked(whole_number, 0), default=3,
                        help="attempts per shard after the first (default 3)")
    parser.add_argument("--multipart-bytes", type=checked(size, 1, maximum=MAX_S3_PART_BYTES), default="64MB",
                        help="S3: shards above this size use a multipart upload")
    parser.add_argument("--part-bytes", type=checked(size, MIN_S3_PART_BYTES, maximum=MAX_S3_PART_BYTES), default="16MB",
                        help="S3: multipart part size (S3 needs at least 5MiB)")


def check(args: argparse.Namespace) -> None:
    check_url(args.url, writable=True)


def run(args: argparse.Namespace) -> int:
    from ..upload import upload

    report = upload(args.shard_dir, args.url, workers=args.workers, verify=args.verify, recheck=args.recheck,
                    retries=args.retries, multipart_bytes=args.multipart_bytes, part_bytes=args.part_bytes,
                    quiet=args.quiet)
    print(report.summary())
    return 0


COMMAND = Command("upload", f"copy shards to {describe(writable=True)}; verified, manifest last", add_arguments, run,
                  usage="SHARD_DIR URL", resumable=True, check=check)
