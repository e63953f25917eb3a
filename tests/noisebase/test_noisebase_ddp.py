"""Two ranks (torchrun, gloo, 127.0.0.1) get the same sequences and batches as noisebase's DDP split."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys

import pytest

from tests.timeouts import SUBPROCESS
from wdsprep.sources.noisebase import TrainingSampleLoader

from .noisebase_testdata import native, require_noisebase, shards

REPO = pathlib.Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_ranks_match_noisebase_ddp_split(tmp_path_factory, tmp_path):
    require_noisebase()
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun not found")
    native_root, shard_root = native(tmp_path_factory), shards(tmp_path_factory)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])  # the worker runs as `-m tests.noisebase...`
    command = [torchrun, "--nproc_per_node=2", "--nnodes=1", "--master_addr=127.0.0.1",
               f"--master_port={_free_port()}", "-m", "tests.noisebase.noisebase_ddp_worker",
               native_root, shard_root, str(tmp_path)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=SUBPROCESS)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["batch_size"] for r in ranks] == [1, 1]
    for r in ranks:  # per rank and epoch: as many batches as noisebase, and some
        assert len(r["batches"]) == 2 and all(mine == theirs > 0 for mine, theirs in r["batches"]), r
        assert r["len"][0] == r["len"][1] > 0, r
    assert ranks[0]["batches"] == ranks[1]["batches"]

    # each rank holds every other sequence of the single-process order, batch by batch
    single = TrainingSampleLoader(shard_root, seed=42, val_split=0.2, batch_size=2, num_workers=0, samples=1,
                                  buffers=["reference"])
    for epoch in range(2):
        whole = [[os.path.basename(f) for f in batch["file"]] for batch in single]
        for rank in range(2):
            assert ranks[rank]["epochs"][epoch] == [[files[rank]] for files in whole]
