"""What one RawNIND conversion unit item is, the config the shards depend on, and the pairs table:
shared by `convert.py` (plan/build) and `streamconvert.py` (fetch straight into shards), which must
agree byte for byte. Kept apart from the Source class, so that fetching straight into shards
imports no more of the converter than it needs."""
from __future__ import annotations

from ...errors import ConfigError

DEFAULT_TILE = 1024
LAYOUTS = ("mosaic", "legacy")
STORE_DTYPES = ("float32", "float16")


def check_options(options: dict) -> None:
    """`--tile-size`, `--layout` and `--store-dtype`, checked before any work (see wdsprep.options)."""
    tile = options.get("tile_size") or DEFAULT_TILE
    if isinstance(tile, bool) or not isinstance(tile, int) or tile < 8 or tile % 4:
        raise ConfigError(f"--tile-size {tile} must be a multiple of 4, at least 8")
    if (options.get("layout") or "mosaic") not in LAYOUTS:
        raise ConfigError(f"--layout {options['layout']!r} is not one of {', '.join(LAYOUTS)}")
    if options.get("store_dtype", "float32") not in STORE_DTYPES:
        raise ConfigError(f"--store-dtype {options['store_dtype']!r} is not one of {', '.join(STORE_DTYPES)}")


def scene_item(root: str, scene, relpaths: dict[str, str]) -> dict:
    """A unit item: one scene's clean captures (`clean`; `gt` is the first) and noisy captures
    (paths below `root`, with their SHA-1s)."""
    reference = scene.clean[0]
    return {
        "root": root,
        "cfa": scene.cfa,
        "scene": scene.name,
        "test_reserve": scene.test_reserve,
        "gt": [relpaths[reference.filename], reference.sha1],
        "clean": [[relpaths[image.filename], image.sha1] for image in scene.clean],
        "noisy": [[relpaths[image.filename], image.sha1] for image in scene.noisy],
    }


def conversion_config(options: dict) -> dict:
    """The source part of the manifest's config (what the shards' bytes depend on)."""
    tile = int(options.get("tile_size") or DEFAULT_TILE)
    if (options.get("layout") or "mosaic") == "mosaic":
        return {
            "tile_size": tile,
            "layout": "mosaic",
            "reference": "every clean capture (upstream's pairs, clean-clean included)",
            "tiles": "train: --tile-size grid; test: upstream's pre-crops (2048 px, stride 1536)",
            "fields": "scene tile: clean uint16 [C,h+2m,w+2m], noisy uint16 [N,h+2a,w+2a], mask packed bits [P,h*w], meta",
            "target": "made at read time: lin_rec2020 (Bayer OpenCV EA demosaic, X-Trans LibRaw VNG), exact shift",
        }
    return {
        "tile_size": tile,
        "store_dtype": options.get("store_dtype", "float32"),
        "reference": "first clean capture",
        "layout": "scene tile: gt_rgb [3,T,T], noisy_bayer [N,4,T/2,T/2], mask [N,T,T], meta",
        "target": "lin_rec2020 (bilinear demosaic)",
    }


def merge_pairs(unit_tables) -> dict:
    """The manifest's `pairs` table: every unit's pair rows, in unit order."""
    return {"pairs": [entry for tables in unit_tables for entry in tables.get("pairs", [])]}
