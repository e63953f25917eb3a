"""The plan and resume oracles of tests/core/test_plan_oracle.py, run over HTTP and S3 with the
read-ahead on: the same tests (imported, not copied), with `counted_shards` here serving the shards
from a Range-capable HTTP server or the S3 test server instead of local disk. The read-ahead's
budget is made tiny (requests of 4 KiB, two at once) so that pieces span several requests, and a
shard's index arrives in the same request as its last samples or in one of its own.

(The integrity oracle over HTTP and S3 is tests/core/test_integrity.py's `..._over_http` and
`..._over_s3`: the read-ahead is on by default there.)"""
import os

import pytest

from tests.core import test_plan_oracle as oracle
from tests.core.shardsets import write_counted_shards
from wdsprep import readoptions
from wdsprep.testing import RangeHTTPServer
from wdsprep.upload import upload


@pytest.fixture(scope="module", autouse=True)
def _tiny_read_ahead():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(readoptions, "MIN_RANGE", 1024)
        patch.setenv("WDSPREP_PREFETCH_BYTES", "16KiB")  # read when each dataset is made
        patch.setenv("WDSPREP_MAX_CONNECTIONS", "2")
        yield


@pytest.fixture(scope="module", params=["http", "s3"])
def counted_shards(request, tmp_path_factory, s3_server):
    """`counted_shards(counts, codec=..., tag=...)` -> the manifest URL of such shards, remote."""
    root = tmp_path_factory.mktemp(f"oracle-{request.param}")
    made: dict = {}
    with RangeHTTPServer(root) as server, s3_server.environment():
        bucket = s3_server.create_bucket(f"oracle-{os.getpid()}") if request.param == "s3" else None

        def make(counts, *, codec="none", tag=""):
            wanted = (tuple(counts), codec, tag)
            if wanted not in made:
                name = f"set{len(made)}"
                write_counted_shards(root / name, list(counts), codec=codec, tag=tag)
                if bucket is None:
                    made[wanted] = f"{server.url}/{name}/manifest.json"
                else:
                    upload(str(root / name), f"s3://{bucket}/{name}")
                    made[wanted] = f"s3://{bucket}/{name}/manifest.json"
            return made[wanted]

        yield make


test_every_rank_and_worker_reads_what_the_model_says_remote = oracle.test_every_rank_and_worker_reads_what_the_model_says
test_resume_and_resume_of_a_resumed_run_give_exactly_the_rest_remote = oracle.test_resume_and_resume_of_a_resumed_run_give_exactly_the_rest
test_a_state_saved_before_a_resumed_run_delivers_is_the_loaded_one_remote = oracle.test_a_state_saved_before_a_resumed_run_delivers_is_the_loaded_one
test_elastic_resume_delivers_the_rest_exactly_once_remote = oracle.test_elastic_resume_delivers_the_rest_exactly_once
test_elastic_resume_after_a_padding_repeat_shuffled_before_its_sample_remote = oracle.test_elastic_resume_after_a_padding_repeat_shuffled_before_its_sample
