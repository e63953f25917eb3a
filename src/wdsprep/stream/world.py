"""The world a reader runs in: this process's rank and world size (`distributed_info`: the arguments,
then torch.distributed, then RANK/WORLD_SIZE) and the DataLoader worker it is (`worker_info`: torch's
worker info, then WORKER/NUM_WORKERS). Its own module, below both wings, so that the reading wing
(stream/reading/access.py sizes its connections per worker) never imports the surfaces; torch is
imported only when asked, so this module is light.
"""
from __future__ import annotations

import os


def distributed_info(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world size): explicit arguments, then torch.distributed, then RANK/WORLD_SIZE."""
    if rank is not None and world_size is not None:
        return rank, world_size
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def worker_info() -> tuple[int, int]:
    """(worker, workers): the DataLoader worker this runs in, else WORKER/NUM_WORKERS (the one way a
    test or a launcher of its own says which worker a process is), else (0, 1)."""
    try:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is not None:
            return info.id, info.num_workers
    except ImportError:
        pass
    return int(os.environ.get("WORKER", 0)), int(os.environ.get("NUM_WORKERS", 1))
