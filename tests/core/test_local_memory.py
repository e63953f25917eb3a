"""Local shards of large samples read batch after batch reuse the memory of the batch before.

A consumer that frees a whole batch of large samples at once (a collate that stacks them, a loop
that drops the batch) hands the allocator a run of free memory; when nothing was allocated above it,
glibc gave it back to the system and the next batch faulted every page in again (256 one-MiB
samples in batches of 64: 4x the page faults, 2.4x the CPU). A local stream holds each sample until
the next is made (stream/worker.py, `holds_outputs`), which keeps that memory in use. Counted in a
fresh process (minor page faults, `getrusage`), on shards made by `wdsprep convert`."""
import subprocess
import sys

from ..timeouts import SUBPROCESS
from .valueshards import convert_value_shards

SAMPLES, BATCH, ELEMENTS = 48, 16, 262_144  # float32: 1 MiB a sample

READ = """
import resource, sys
import wdsprep
ds = wdsprep.dataset(sys.argv[1], "train", shuffle_shards=False, equalize=None)
if sys.argv[2] == "decoded":
    ds = ds.compose(wdsprep.decode(strip=True))
batch, samples = [], 0
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for sample in ds:
    batch.append(sample)
    samples += 1
    if len(batch) == int(sys.argv[3]):
        batch = []  # the whole batch freed at once
print(samples, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_batches_of_large_local_samples_reuse_the_memory_of_the_one_before(tmp_path):
    manifest = convert_value_shards(tmp_path, SAMPLES, ELEMENTS, "256MB")
    pages = SAMPLES * ELEMENTS * 4 // 4096  # what faulting every sample's bytes in would cost
    for mode in ("raw", "decoded"):
        result = subprocess.run([sys.executable, "-c", READ, manifest, mode, str(BATCH)], capture_output=True,
                                text=True, timeout=SUBPROCESS, check=True)
        samples, faults = map(int, result.stdout.split())
        assert samples == SAMPLES
        assert faults < pages // 2, (mode, faults, pages)  # one batch's worth (and change), not every batch's
