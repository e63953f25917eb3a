"""Selections over HTTP and S3: the split's sample table is one request, made only when a selection (or
a key lookup) asks for it; plain streaming never asks; the kept samples are the model's
(tests/core/test_select_oracle.py) on every rank, read by the read-ahead."""
from __future__ import annotations

import pathlib

import pytest

import wdsprep
from wdsprep.testing import RangeHTTPServer
from wdsprep.upload import upload

from tests.core.test_select_oracle import SELECTIONS, labelled, model_items, model_kept, real_worker  # noqa: F401 (fixture)
from tests.core.test_plan_oracle import model_worker_stream


@pytest.mark.parametrize("name", ["select", "all four"])
def test_over_http_the_table_is_one_request_and_ranks_read_the_models_share(labelled, name):
    manifest, shards, values = labelled
    output = pathlib.Path(manifest).parent
    items = model_items(model_kept(shards["train"], values["train"], seed=3, **SELECTIONS[name][1]), 3, 1)
    with RangeHTTPServer(output) as server:
        manifest = server.url_of("manifest.json")
        for rank in range(3):
            plan = dict(world=3, rank=rank, equalize="pad", buffer=2, seed=3, epoch=1)
            for worker in range(2):
                before = len(server.requests_for("train.samples"))
                got = real_worker(manifest, SELECTIONS[name][0], workers=2, worker=worker, **plan)
                assert got == model_worker_stream(items, workers=2, worker=worker, **plan), (rank, worker)
                table = server.requests_for("train.samples")[before:]
                assert [(r["method"], r["status"]) for r in table] == [("GET", 200)]  # one request, whole
        del server.requests[:]
        plain = [s["__key__"] for s in wdsprep.dataset(manifest, "train", shuffle_shards=False)]
        assert plain == [key for shard in shards["train"] for key in shard]
        assert not [r for r in server.requests if r["name"].endswith(".samples")]  # never read without a selection


def test_over_s3_a_selection_reads_the_uploaded_table(labelled, s3, bucket):
    manifest, shards, values = labelled
    output = pathlib.Path(manifest).parent
    upload(str(output), f"s3://{bucket}/sel", workers=2)
    per_shard = model_kept(shards["valid"], values["valid"], where=lambda m: m["label"] < 3)
    s3.clear_log()
    got = [s["__key__"] for s in wdsprep.dataset(f"s3://{bucket}/sel", "valid", select="meta.label < 3",
                                                 shuffle_shards=False)]
    assert got == [key for shard in per_shard for key in shard]
    gets = [r for r in s3.requests if r["method"] == "GET" and r["key"] == "sel/valid.samples"]
    assert len(gets) == 1
