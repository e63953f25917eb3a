"""The loader streams shards from http and s3 like from local disk, never copying them whole."""
from __future__ import annotations

import functools
import http.server
import threading

import pytest

from tests.timeouts import EVENT
from wdsprep.sources.noisebase import TrainingSampleLoader

from .noisebase_testdata import ALL_BUFFERS, assert_same_batches, shards

ARGS = dict(seed=42, val_split=0.2, batch_size=2, num_workers=0, samples=4, buffers=ALL_BUFFERS)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    requested: list = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        type(self).requested.append(self.path)
        super().do_GET()


@pytest.fixture()
def http_url(tmp_path_factory):
    directory = shards(tmp_path_factory)
    handler = functools.partial(_QuietHandler, directory=directory)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=EVENT)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_http_stream_matches_local(tmp_path_factory, http_url, num_workers):
    _QuietHandler.requested.clear()
    remote = TrainingSampleLoader(http_url + "/manifest.json", **dict(ARGS, num_workers=num_workers))
    local = TrainingSampleLoader(shards(tmp_path_factory), **ARGS)
    assert_same_batches(remote, local)
    assert any(path.endswith(".tar") for path in _QuietHandler.requested)


def test_s3_stream_matches_local(tmp_path_factory, monkeypatch):
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    import os

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        for name, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
            monkeypatch.setenv(name, value)
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="noisebase-test")
        directory = shards(tmp_path_factory)
        for name in os.listdir(directory):
            if name.endswith((".tar", ".json")):
                client.upload_file(os.path.join(directory, name), "noisebase-test", f"set/{name}")
        remote_loader = TrainingSampleLoader("s3://noisebase-test/set/manifest.json", **ARGS)
        local = TrainingSampleLoader(directory, **ARGS)
        assert_same_batches(remote_loader, local)
    finally:
        server.stop()


def test_remote_frames_are_checked_and_older_shards_hashed_or_refused(tmp_path_factory, tmp_path):
    """Over HTTP (Range requests) a flipped byte in a frame's member is a ShardError naming the shard;
    shards without an index (an older conversion) read locally like indexed ones (each hashed whole
    first) and are refused remotely with the line naming `wdsprep reindex`."""
    import shutil

    from tests.core.shardsets import each_member_flipped, make_older
    from wdsprep.errors import ShardError
    from wdsprep.testing import RangeHTTPServer
    from wdsprep.conformance import run_cli

    from .noisebase_testdata import native

    current, older = tmp_path / "current", tmp_path / "older"
    status, _, err = run_cli("convert", "noisebase", native(tmp_path_factory), current, "--codec", "none",
                             "--shard-bytes", "200KB", "--quiet")
    assert status == 0, err
    shutil.copytree(current, older)
    make_older(older)
    args = dict(ARGS, val_split=0.0)
    assert_same_batches(TrainingSampleLoader(str(older), **args), TrainingSampleLoader(str(current), **args))
    with RangeHTTPServer(tmp_path) as server:
        assert_same_batches(TrainingSampleLoader(server.url_of("current/manifest.json"), **args),
                            TrainingSampleLoader(str(current), **args))
        with pytest.raises(ShardError, match="wdsprep reindex"):
            list(TrainingSampleLoader(server.url_of("older/manifest.json"), **args))
        flips = each_member_flipped(current, keep=lambda key, member: member == "position.npy")
        path, key, member = next(flips)
        with pytest.raises(ShardError, match=rf"{path.name}: member {key}\.{member}: corrupt"):
            list(TrainingSampleLoader(server.url_of("current/manifest.json"), **args))
        flips.close()  # the byte goes back
    flips = each_member_flipped(older, keep=lambda key, member: member == "position.npy")
    path, key, member = next(flips)
    with pytest.raises(ShardError, match=rf"{path.name}: sha256 differs"):
        list(TrainingSampleLoader(str(older), **args))
    flips.close()
