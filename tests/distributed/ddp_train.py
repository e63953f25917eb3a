"""One rank of a DDP training loop that streams wdsprep shards from a URL (run under torchrun).

    torchrun --nproc_per_node=2 tests/distributed/ddp_train.py MANIFEST_URL OUT_DIR [--stop-after K | --resume STATE_DIR]
    (--resume-all STATE_DIR: load every old rank's state, saved on any world size, for an elastic resume;
    --mix: MANIFEST_URL is a mix file, read by wdsprep.mix)

The process refuses to write anything to local disk: an audit hook raises on every file opened for
writing (and on mkdir/rename/truncate/temp files) except this rank's result file, shared memory
(/dev/shm, and the Loader's slabs: memfd_create's anonymous files), so "no local copy" is
checked, not assumed. It writes OUT_DIR/rank<R>.json: the keys of every batch of the epoch, the
batch counts of a second split, and (with --stop-after) the loader state after K steps; with
--resume it loads that state and records the batches it yields for the rest of the epoch.
"""
import sys

sys.dont_write_bytecode = True  # importing must not write .pyc files either

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

ALLOWED_PREFIXES = ["/dev/null", "/dev/shm/"]
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
WRITE_EVENTS = {"os.mkdir", "os.rename", "os.replace", "os.remove", "os.symlink", "os.link", "os.truncate",
                "shutil.copyfile", "shutil.copytree", "tempfile.mkstemp", "tempfile.mkdtemp"}
violations: list[str] = []


def _allowed(path) -> bool:
    if isinstance(path, int):  # a file descriptor: what it names (memfd_create's anonymous memory is no disk)
        try:
            path = os.readlink(f"/proc/self/fd/{path}")
        except OSError:
            return False
        if path.startswith("/memfd:"):
            return True
    path = os.fsdecode(path) if isinstance(path, (bytes, str, os.PathLike)) else str(path)
    return any(path.startswith(prefix) for prefix in ALLOWED_PREFIXES)


def _ipc_dir(event, args) -> bool:
    """multiprocessing's private directory for the Unix socket through which DataLoader workers pass
    tensor file descriptors (`pymp-*`): a rendezvous point, no data is ever written there."""
    path = os.fsdecode(args[0]) if isinstance(args[0], (str, bytes)) else ""
    return event in ("tempfile.mkdtemp", "os.mkdir", "os.remove") and any(
        part.startswith("pymp-") for part in path.split(os.sep)
    )


def _audit(event, args):
    if event == "open":
        path, mode, flags = args
        if isinstance(path, int):
            return
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & WRITE_FLAGS
        )
        if writing and not _allowed(path):
            violations.append(f"open {path!r} mode={mode!r}")
            raise PermissionError(f"ddp_train: local disk write refused: {path!r}")
    elif event in WRITE_EVENTS:
        target = args[-1] if event in ("os.rename", "os.replace", "shutil.copyfile") else args[0]
        if target is not None and not _allowed(target) and not _ipc_dir(event, args):
            violations.append(f"{event} {args!r}")
            raise PermissionError(f"ddp_train: local disk write refused: {event} {args!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("manifest")
    parser.add_argument("out")
    parser.add_argument("--split", default="train")
    parser.add_argument("--second-split", default=None)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument("--stop-after", type=int, default=None)
    parser.add_argument("--resume", default=None, help="directory of rank<R>.json files holding states")
    parser.add_argument("--resume-all", default=None,
                        help="directory of every old rank's rank<R>.json: an elastic resume on this world")
    parser.add_argument("--only-partial", action="store_true", help="with --stop-after: skip the full epoch")
    parser.add_argument("--mix", action="store_true",
                        help="MANIFEST_URL is a mix file: train on wdsprep.mix(MANIFEST_URL); keys are part/key")
    parser.add_argument("--pairs", type=int, default=None, metavar="H",
                        help="Minecraft shards: train on wdsprep.minecraft.pairs(history_length=H), balanced on pairs")
    args = parser.parse_args()

    rank_env = int(os.environ["RANK"])
    result_path = os.path.join(os.path.abspath(args.out), f"rank{rank_env}.json")
    ALLOWED_PREFIXES.append(result_path)

    import tempfile
    from datetime import timedelta

    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import torch._dynamo  # noqa: F401  (DDP imports it; its import probes the temp dir by writing a file)

    import wdsprep

    tempfile.gettempdir()  # the same probe, done once before the hook; nothing after may write
    sys.addaudithook(_audit)  # from here on: no local file written (data loading, workers, training)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))  # a hang guard, generous for a loaded machine
    rank, world = dist.get_rank(), dist.get_world_size()

    def collate(samples):
        decoded = [wdsprep.decode_sample(s) for s in samples]
        return {"keys": [d["__key__"] for d in decoded],
                "x": torch.from_numpy(np.stack([d["array"] for d in decoded]))}

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4096, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def train(loader, stop_after=None):
        batches = []
        iterator = iter(loader)
        for batch in iterator:
            loss = model(batch["x"]).pow(2).mean()  # the gradient all-reduce hangs if ranks disagree on counts
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            batches.append(batch["keys"])
            if stop_after is not None and len(batches) == stop_after:
                break  # checkpoint here: the state covers exactly the batches trained on
        iterator.close()  # stop this epoch's DataLoader workers now, not at interpreter exit
        return batches

    def collate_pairs(pairs):
        return {"keys": [p["__key__"] for p in pairs],  # a voxel's mean as a 4096-wide input: the model is not the point
                "x": torch.stack([p["voxel"].float().mean().expand(4096) for p in pairs])}

    def collate_mix(samples):
        decoded = [wdsprep.decode_sample(s) for s in samples]
        return {"keys": [f"{d['__part__']}/{d['__key__']}" for d in decoded],
                "x": torch.from_numpy(np.stack([d["array"] for d in decoded]))}

    def make_loader(split):
        if args.mix:
            dataset = wdsprep.mix(args.manifest, seed=args.seed, equalize="pad")
            dataset.set_epoch(args.epoch)
            loader = wdsprep.Loader(dataset, batch_size=args.batch_size, num_workers=args.workers,
                                    collate_fn=collate_mix, timeout=600)
            loader.set_epoch(args.epoch)
            return dataset, loader
        if args.pairs:
            dataset = wdsprep.dataset(args.manifest, split, seed=args.seed, equalize="pad",
                                      outputs_per_sample=wdsprep.minecraft.pair_counts(history_length=args.pairs))
            dataset = dataset.compose(wdsprep.minecraft.pairs(history_length=args.pairs))
            dataset.set_epoch(args.epoch)
            loader = wdsprep.Loader(dataset, batch_size=args.batch_size, num_workers=args.workers,
                                    collate_fn=collate_pairs, timeout=600)
            loader.set_epoch(args.epoch)
            return dataset, loader
        dataset = wdsprep.dataset(args.manifest, split, seed=args.seed, equalize="pad")
        dataset.set_epoch(args.epoch)
        loader = wdsprep.Loader(dataset, batch_size=args.batch_size, num_workers=args.workers, collate_fn=collate,
                                timeout=600)  # a worker that dies fails the step instead of hanging it
        loader.set_epoch(args.epoch)
        return dataset, loader

    result = {"rank": rank, "world_size": world}
    dataset, loader = make_loader(args.split)
    result["samples_per_rank"] = len(dataset)
    if args.resume:
        with open(os.path.join(args.resume, f"rank{rank}.json")) as handle:
            state = json.load(handle)["state"]
        loader.load_state_dict(state)
        result["resumed"] = train(loader)
    elif args.resume_all:
        old = sorted(name for name in os.listdir(args.resume_all) if name.startswith("rank"))
        states = []
        for name in old:
            with open(os.path.join(args.resume_all, name)) as handle:
                states.append(json.load(handle)["state"])
        loader.load_state_dict(states)
        result["resumed"] = train(loader)
    else:
        if not args.only_partial:
            result["epoch"] = train(loader)
        if args.stop_after is not None:
            _, partial = make_loader(args.split)
            result["partial"] = train(partial, stop_after=args.stop_after)
            result["state"] = partial.state_dict()
        if args.second_split:
            _, second = make_loader(args.second_split)
            result["second"] = train(second)

    counts = [None] * world
    dist.all_gather_object(counts, {k: len(v) for k, v in result.items() if isinstance(v, list)})
    result["all_counts"] = counts
    result["violations"] = violations
    with open(result_path, "w") as handle:
        json.dump(result, handle)
    dist.barrier()
    del model, optimizer
    dist.destroy_process_group()
    # The results are written. Tearing down torch's C++ objects at interpreter exit was seen to hang
    # a rank now and then (a native destructor, after destroy_process_group); that is not what this
    # test is about, so leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
