"""Plain readers decode wdsprep members by themselves: webdataset, Hugging Face datasets, Ray Data.

Every member extension is one these readers know (`.npy`, `.npz`, `.mp`, `.json`), some wrapped in
a zstd frame (`.npy.zst`, `.npz.zst`):

- Hugging Face `datasets.load_dataset("webdataset", ...)` undoes `.zst` itself: nothing to do.
- webdataset 1.0.x has no decoder registry; its extension point is the list
  `webdataset.autodecode.default_pre_handlers`, which every `Decoder` built without `pre=` runs
  before its handlers (it holds webdataset's own `.gz` handler). `register_webdataset_decoder()`,
  run by `import wdsprep`, appends `zst_handler` to that list once: `wds.WebDataset(urls).decode()`
  then decodes `.npy.zst` and `.npz.zst` with webdataset's own `.npy`/`.npz` decoders, the way
  its `.gz` handler does (`Continue` with the inner name). Nothing of webdataset is replaced. A
  pipeline that passes its own `pre=` adds the handler itself: `.decode(wdsprep.zst_handler)`.
  webdataset imports torch, which takes seconds, so the registration waits for its import.
- Ray Data: `ray.data.read_webdataset(urls, decoder=wdsprep.decode_sample)` (its default decoder
  knows no `.zst`).
"""
from __future__ import annotations

import sys

import zstandard

from ..errors import FormatError
from ..storage.gopen import when_imported
from .codec import inflate


def zst_handler(key: str, data: bytes):
    """A webdataset decoder handler: `<field>.<ext>.zst` -> webdataset `Continue(<field>.<ext>, bytes)`;
    a frame that would inflate beyond what a member may hold is a `FormatError` (`codec.inflate`)."""
    if not key.endswith(".zst"):
        return None
    from webdataset.autodecode import Continue

    try:
        raw = inflate(data)
    except zstandard.ZstdError as error:
        raise FormatError(f"member {key!r}: corrupt zstd data: {error}") from None
    except FormatError as error:
        raise FormatError(f"member {key!r}: {error}") from None
    return Continue(key[:-4], raw)


def register_webdataset_decoder() -> None:
    """Append `zst_handler` to webdataset's default pre-handlers (idempotent; waits for the import)."""
    autodecode = sys.modules.get("webdataset.autodecode")
    if autodecode is None:
        when_imported("webdataset.autodecode", register_webdataset_decoder)
        return
    if zst_handler not in autodecode.default_pre_handlers:
        autodecode.default_pre_handlers.append(zst_handler)
