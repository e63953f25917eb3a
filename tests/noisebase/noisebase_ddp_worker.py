"""Run under torchrun (gloo): each rank compares our loader with noisebase's and records its files."""
import json
import os
import sys
import warnings

import torch.distributed as dist

warnings.filterwarnings("ignore")

from tests.noisebase.noisebase_testdata import assert_same_batch, reference_loader  # noqa: E402
from wdsprep.sources.noisebase import TrainingSampleLoader  # noqa: E402


def main(native_root: str, shard_root: str, out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    args = dict(seed=42, val_split=0.2, shuffle=True, batch_size=2, drop_last=True, num_workers=0,
                flip_rotate=True, stage="train", samples=2, buffers=["color", "motion"])
    ours = TrainingSampleLoader(shard_root, **args)
    theirs = reference_loader(native_root, **args)
    record = {"rank": rank, "batch_size": ours.batch_sampler.batch_size, "epochs": []}
    for epoch in range(2):
        files = []
        mine_all, theirs_all = list(ours), list(theirs)
        record.setdefault("batches", []).append([len(mine_all), len(theirs_all)])
        assert len(mine_all) == len(theirs_all) > 0, (rank, epoch, len(mine_all), len(theirs_all))
        for mine, reference in zip(mine_all, theirs_all):
            assert_same_batch(mine, reference)
            files.append([os.path.basename(f) for f in mine["file"]])
        record["epochs"].append(files)
    record["len"] = [len(ours), len(theirs)]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(record, handle)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
