"""Plain readers open every source's shards (issue #29): Hugging Face `datasets.load_dataset("webdataset")`
(streaming and not), Ray Data `read_webdataset` and plain `wds.WebDataset(urls).decode()` read every split
of each source's `wdsprep pipeline pipelines/<source>.toml` output (and of a `generic` conversion), and
every array equals, dtype and shape included, what `wdsprep.decode()` yields through wdsprep's own reader.
Packed fields are undone from the manifest's field table alone (no wdsprep code) and compared with what
wdsprep's source readers make of them, or with the native files.

The readers are the second libraries here: HF datasets and Ray Data hold a split as one Arrow table, so a
split whose samples disagree in members, dtypes or ranks fails to load at all (#29's symptoms).
Bounded: the shard sets are the pipelines' small synthetic data, built once per module; one Ray session
per module; HF datasets caches under a temporary directory, offline.
"""
import json
import math
import os
import pathlib

import h5py
import nibabel as nib
import numpy as np
import pytest
import webdataset as wds

import wdsprep
from wdsprep.cli import main
from wdsprep.shards.manifest import field_table_problems

ROOT = pathlib.Path(__file__).resolve().parents[2]
PIPELINES = ("voxels", "minecraft", "deepreg", "rawnind", "noisebase")
SOURCES = (*PIPELINES, "generic")


@pytest.fixture(scope="module")
def shard_sets(tmp_path_factory):
    """{source: manifest path}: each pipeline run as `make shards` runs it, into a temporary directory."""
    root = tmp_path_factory.mktemp("interop")
    (root / "pipelines").mkdir()
    made = {}
    for source in PIPELINES:  # the specs' `data/<source>` input and `shards/<source>` output are under root
        spec = root / "pipelines" / f"{source}.toml"
        spec.write_bytes((ROOT / "pipelines" / f"{source}.toml").read_bytes())
        assert main(["pipeline", str(spec), "--quiet"]) == 0
        made[source] = root / "shards" / source / "manifest.json"
    from wdsprep.sources.generic.synth import synth

    synth(str(root / "data" / "generic"), 0, splits={"train": 12, "valid": 3})
    assert main(["convert", "generic", str(root / "data" / "generic"), str(root / "shards" / "generic"), "--quiet"]) == 0
    made["generic"] = root / "shards" / "generic" / "manifest.json"
    made["_data"] = root / "data"
    return made


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hf-cache")
    saved = {name: os.environ.get(name) for name in ("HF_HOME", "HF_DATASETS_CACHE", "HF_DATASETS_OFFLINE")}
    os.environ.update(HF_HOME=str(cache), HF_DATASETS_CACHE=str(cache / "datasets"), HF_DATASETS_OFFLINE="1")
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    yield datasets, str(cache / "datasets")
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def ray_data():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


def splits_of(manifest_path) -> list[str]:
    return sorted(json.loads(pathlib.Path(manifest_path).read_text())["splits"])


def every_split():
    return [pytest.param(source, id=source) for source in SOURCES]


def wdsprep_samples(manifest_path, split: str) -> dict:
    """{key: sample} as wdsprep's own reader and `wdsprep.decode()` give them (member names kept)."""
    pipeline = wdsprep.dataset(str(manifest_path), split, shuffle_shards=False, equalize=None,
                               rank=0, world_size=1).compose(wdsprep.decode())
    found = {}
    for sample in pipeline:
        found[sample["__key__"]] = {name: value for name, value in sample.items() if not name.startswith("__")}
    return found


# ----------------------------------------------------------------------------------- comparisons
def leaf_dtype(feature):
    """The Arrow value type under an HF feature's nesting (List/Sequence/ArrayND), e.g. "float32"."""
    while not hasattr(feature, "dtype") or hasattr(feature, "feature"):
        feature = feature.feature
    return feature.dtype


def same(got, want, where: str, exact_dtype: bool) -> None:
    """`got` (a reader's value) equals `want` (wdsprep's): arrays by shape, dtype and every value."""
    if isinstance(want, np.ndarray):
        array = np.asarray(got)
        if exact_dtype:
            assert isinstance(got, np.ndarray) and got.dtype == want.dtype, (where, getattr(got, "dtype", type(got)))
        assert array.shape == want.shape, (where, array.shape, want.shape)
        np.testing.assert_array_equal(array.astype(want.dtype) if array.size else array.reshape(want.shape), want,
                                      err_msg=where)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), (where, sorted(got), sorted(want))
        for name in want:
            same(got[name], want[name], f"{where}.{name}", exact_dtype)
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for index, (a, b) in enumerate(zip(got, want)):
            same(a, b, f"{where}[{index}]", exact_dtype)
    elif isinstance(want, float) and math.isnan(want):
        assert math.isnan(got), where
    else:
        assert got == want, (where, got, want)


def check_dtypes(features, want: dict, where: str) -> None:
    """HF's inferred schema: every array (and .npz column) has the dtype wdsprep wrote."""
    for name, value in want.items():
        if isinstance(value, np.ndarray):
            assert leaf_dtype(features[name]) == value.dtype.name, (where, name, features[name])
        elif isinstance(value, dict) and value and all(isinstance(v, np.ndarray) for v in value.values()):
            for column, array in value.items():
                assert leaf_dtype(features[name][column]) == array.dtype.name, (where, name, column)


# ----------------------------------------------------------------------------------------- the readers
@pytest.mark.parametrize("source", every_split())
def test_hf_datasets_load_every_split_with_wdsprep_s_arrays(shard_sets, hf, source):
    datasets, cache = hf
    for split in splits_of(shard_sets[source]):
        want = wdsprep_samples(shard_sets[source], split)
        files = wdsprep.urls(str(shard_sets[source]), split)
        for streaming in (False, True):
            loaded = datasets.load_dataset("webdataset", data_files={split: files}, split=split,
                                           streaming=streaming, cache_dir=cache)
            seen = set()
            for row in loaded:
                key = row["__key__"]
                fields = {name: value for name, value in row.items() if not name.startswith("__")}
                same(fields, want[key], f"{source}/{split}/{key} (streaming={streaming})", exact_dtype=False)
                seen.add(key)
            assert seen == set(want), (source, split, streaming)
            check_dtypes(loaded.features, next(iter(want.values())), f"{source}/{split}")


@pytest.mark.parametrize("source", every_split())
def test_ray_data_reads_every_split_with_the_documented_decoder(shard_sets, ray_data, source):
    for split in splits_of(shard_sets[source]):
        want = {key: wdsprep.decode_sample({"__key__": key, **sample}) for key, sample in
                wdsprep_samples(shard_sets[source], split).items()}
        files = [os.path.abspath(url) for url in wdsprep.urls(str(shard_sets[source]), split)]
        rows = ray_data.data.read_webdataset(files, decoder=wdsprep.decode_sample).take_all()
        assert sorted(row["__key__"] for row in rows) == sorted(want)
        for row in rows:
            fields = {name: value for name, value in row.items() if not name.startswith("__")}
            expected = {name: value for name, value in want[row["__key__"]].items() if not name.startswith("__")}
            same(fields, expected, f"{source}/{split}/{row['__key__']} (ray)", exact_dtype=False)


@pytest.mark.parametrize("source", every_split())
def test_plain_webdataset_decode_gives_wdsprep_s_arrays(shard_sets, source):
    """`import wdsprep` is all: webdataset's own `.decode()` then undoes `.zst` (its pre-handler list)."""
    for split in splits_of(shard_sets[source]):
        want = wdsprep_samples(shard_sets[source], split)
        got = {}
        for sample in wds.WebDataset(wdsprep.urls(str(shard_sets[source]), split), shardshuffle=False).decode():
            got[sample["__key__"]] = {name: value for name, value in sample.items() if not name.startswith("__")}
        assert sorted(got) == sorted(want)
        for key in want:
            same(got[key], want[key], f"{source}/{split}/{key} (webdataset)", exact_dtype=True)


def test_the_explicit_handler_works_where_a_pipeline_passes_its_own_pre_handlers(shard_sets):
    url = wdsprep.urls(str(shard_sets["minecraft"]), "train")
    plain = next(iter(wds.WebDataset(url, shardshuffle=False).decode(pre=[])))
    assert isinstance(plain["voxels.npy.zst"], bytes)  # no pre-handlers: the member stays bytes
    sample = next(iter(wds.WebDataset(url, shardshuffle=False).decode(wdsprep.zst_handler, pre=[])))
    want = wdsprep_samples(shard_sets["minecraft"], "train")[sample["__key__"]]
    same(sample["voxels.npy.zst"], want["voxels.npy.zst"], "minecraft voxels", exact_dtype=True)


# ------------------------------------------------------------------------------------ the field tables
@pytest.mark.parametrize("source", ["voxels", "deepreg"])
def test_the_field_table_describes_every_member_and_every_split_shares_one_schema(shard_sets, source):
    manifest = json.loads(pathlib.Path(shard_sets[source]).read_text())
    assert manifest["format"] == "wdsprep/2"
    tables = manifest["tables"]["fields"]
    assert sorted(tables) == sorted(manifest["splits"])
    for split, table in tables.items():
        assert field_table_problems(table) == [], split
        for key, sample in wdsprep_samples(shard_sets[source], split).items():
            assert sorted(sample) == sorted(table), (split, key)
            for member, value in sample.items():
                entry = table[member]
                if isinstance(value, np.ndarray):
                    assert entry["kind"] == "array" and entry["dtype"] == value.dtype.str, (split, member)
                    assert len(entry["shape"]) == value.ndim
                    assert all(d is None or d == n for d, n in zip(entry["shape"], value.shape)), (split, member)
                elif entry["kind"] == "columns":
                    assert sorted(value) == sorted(entry["columns"]), (split, member)
                    for column, array in value.items():
                        assert entry["columns"][column]["dtype"] == array.dtype.str
                else:
                    assert entry["kind"] == "value"


def unpack_from_table(entry: dict, packed, meta: dict) -> np.ndarray:
    """A packed member undone with nothing but its field-table entry (what a user without wdsprep does)."""
    encoding = entry["encoding"]
    assert encoding["name"] == "packbits" and encoding["shape"]["member"] == "meta.mp"
    shape = meta[encoding["shape"]["key"]]
    bits = np.unpackbits(np.asarray(packed, dtype=entry["dtype"]), count=math.prod(shape), bitorder=encoding["bitorder"])
    return bits.reshape(shape, order=encoding["order"]).astype(encoding["dtype"])


def test_packed_voxels_undone_from_the_table_are_the_reader_s_voxels(shard_sets, hf):
    datasets, cache = hf
    manifest = json.loads(pathlib.Path(shard_sets["voxels"]).read_text())
    reader = wdsprep.voxels.samples(mode="dense", include_empty=True)
    for split in ("train", "val"):
        entry = manifest["tables"]["fields"][split]["voxels_packed.npy.zst"]
        files = wdsprep.urls(str(shard_sets["voxels"]), split)
        loaded = datasets.load_dataset("webdataset", data_files={split: files}, split=split, cache_dir=cache)
        dense = {}
        for raw in wds.WebDataset(files, shardshuffle=False):
            first = next(reader(iter([raw])))
            dense[raw["__key__"]] = first["voxels"][0].numpy() > 0
        for row in loaded.select(range(0, len(loaded), 7)):
            grid = unpack_from_table(entry, row["voxels_packed.npy.zst"], row["meta.mp"])
            assert grid.shape == dense[row["__key__"]].shape
            np.testing.assert_array_equal(grid, dense[row["__key__"]])
            rays = row["rays.npz.zst"]
            for column in ("face_ids", "view_ids"):  # present in the synthetic ray files: full length
                assert len(rays[column]) == row["meta.mp"]["num_rays"]


def group_volumes(entry: dict, group, meta: dict, role: str) -> list[np.ndarray]:
    """A grouped member undone with its field-table entry: stacked on axis 0, or raveled + concatenated."""
    group = np.asarray(group)
    if entry["encoding"]["name"] == "stack":
        return list(group)
    shapes = [volume[role]["shape"] for volume in meta["volumes"]]
    ends = np.cumsum([math.prod(shape) for shape in shapes])
    return [piece.reshape(shape) for piece, shape in zip(np.split(group, ends[:-1]), shapes)]


def native_volume(data_root: pathlib.Path, file: str) -> np.ndarray:
    """The volume of a `meta.volumes[...].file` entry read straight from the synthetic native files."""
    if ".h5:" in file:
        path, key = file.split(".h5:")
        with h5py.File(data_root / (path + ".h5"), "r") as handle:
            return handle[key][()]
    return np.asanyarray(nib.load(data_root / file).dataobj.get_unscaled())


def test_grouped_volumes_undone_from_the_table_are_the_native_files(shard_sets, hf):
    datasets, cache = hf
    manifest = json.loads(pathlib.Path(shard_sets["deepreg"]).read_text())
    data_root = shard_sets["_data"] / "deepreg"
    checked = 0
    for split in (s for s in manifest["splits"] if s.startswith("grouped")):
        table = manifest["tables"]["fields"][split]
        files = wdsprep.urls(str(shard_sets["deepreg"]), split)
        for row in datasets.load_dataset("webdataset", data_files={split: files}, split=split, cache_dir=cache):
            meta = row["meta.mp"]
            for role in ("image", "label"):
                entry = table[f"{role}s.npy.zst"]
                volumes = group_volumes(entry, row[f"{role}s.npy.zst"], meta, role)
                assert len(volumes) == len(meta["names"])
                for volume, volume_meta in zip(volumes, meta["volumes"]):
                    native = native_volume(data_root, volume_meta[role]["file"])
                    if role == "label" and native.ndim == 3:
                        native = native[..., None]  # the table's note: a single label has C = 1
                    assert volume.shape == native.shape
                    np.testing.assert_array_equal(volume, native)
                    checked += 1
    assert checked > 20


# ------------------------------------------------------------------------------ older shards still read
def rewrite_shards(manifest_path, out: pathlib.Path, transform) -> str:
    """The shard set again, each sample's fields through `transform` (to an older layout), written with
    the public ShardWriter and listed by a `wdsprep/1` manifest (one shard per original shard)."""
    from wdsprep.shards.codec import Encoder
    from wdsprep.shards.manifest import Manifest
    from wdsprep.shards.writer import ShardWriter

    manifest = json.loads(pathlib.Path(manifest_path).read_text())
    out.mkdir(parents=True)
    splits = {}
    for split, entry in manifest["splits"].items():
        rows = []
        for row in entry["shards"]:
            url = str(pathlib.Path(manifest_path).parent / row["name"])
            writer = ShardWriter(str(out), row["name"].rsplit("-", 1)[0], shard_bytes=1 << 40, encoder=Encoder("zstd"))
            with writer:
                for sample in wds.WebDataset(url, shardshuffle=False):
                    fields = wdsprep.decode_sample(sample)
                    writer.write(sample["__key__"], transform({k: v for k, v in fields.items() if not k.startswith("__")}))
            rows.extend(dict(r.as_dict(), unit=row["unit"]) for r in writer.rows)
        splits[split] = rows
    tables = {name: table for name, table in manifest["tables"].items() if name != "fields"}
    older = Manifest(manifest["source"], manifest["config"], manifest["fingerprint"], splits, tables, format="wdsprep/1")
    (out / "manifest.json").write_bytes(older.dumps())
    return str(out / "manifest.json")


def voxels_v1(fields: dict) -> dict:
    """A voxels/1 sample as wdsprep 0.1 wrote it: the per-ray arrays the ray file had as one structured array."""
    meta = dict(fields["meta"], format="voxels/1")
    names = [name for name in fields["rays"] if name in meta["ray_fields"]]
    columns = {name: fields["rays"][name] for name in names}
    table = np.empty(meta["num_rays"], dtype=[(name, a.dtype, a.shape[1:]) for name, a in columns.items()])
    for name, array in columns.items():
        table[name] = array
    return {**{k: v for k, v in fields.items() if k not in ("rays", "meta")}, "rays": table, "meta": meta}


def stream(manifest_path, split: str, stage) -> list:
    return list(wds.WebDataset(wdsprep.urls(str(manifest_path), split), shardshuffle=False).compose(stage))


def test_voxels_1_shards_still_read_to_the_same_training_samples(shard_sets, tmp_path):
    older = rewrite_shards(shard_sets["voxels"], tmp_path / "v1", voxels_v1)
    assert json.loads(pathlib.Path(older).read_text())["format"] == "wdsprep/1"
    first = next(iter(wds.WebDataset(wdsprep.urls(older, "val"), shardshuffle=False)))
    assert "rays.npy.zst" in first and "rays.npz.zst" not in first  # the structured array of voxels/1
    for split in ("val", "test"):
        stage = wdsprep.voxels.samples(mode="graph", rays_per_chunk=300, include_empty=True)
        now, before = stream(shard_sets["voxels"], split, stage), stream(older, split, stage)
        assert len(now) == len(before) > 0
        for a, b in zip(now, before):
            same({k: v.numpy() if hasattr(v, "numpy") else v for k, v in b.items()},
                 {k: v.numpy() if hasattr(v, "numpy") else v for k, v in a.items()}, split, exact_dtype=True)
    mapped_now = wdsprep.voxels.HierarchicalVoxelRayDataset(str(shard_sets["voxels"]), split="val", rays_per_chunk=500)
    mapped_before = wdsprep.voxels.HierarchicalVoxelRayDataset(older, split="val", rays_per_chunk=500)
    assert len(mapped_now) == len(mapped_before)
    for index in range(0, len(mapped_now), 5):
        a, b = mapped_now[index], mapped_before[index]
        same({k: v.numpy() if hasattr(v, "numpy") else v for k, v in b.items()},
             {k: v.numpy() if hasattr(v, "numpy") else v for k, v in a.items()}, f"val[{index}]", exact_dtype=True)


def deepreg_v1(fields: dict) -> dict:
    """A sample in the first deepreg layout: one member per group position, 3-D single labels, no identity scale."""
    meta = json.loads(json.dumps(fields["meta"]))
    out = {"meta": meta}

    def volume_meta(volume):
        if volume.get("scale") == [1.0, 0.0]:
            del volume["scale"]
        volume.pop("shape", None)
        return volume

    def squeeze(array):
        return array[..., 0] if array.ndim == 4 and array.shape[-1] == 1 else array

    if meta["type"] == "grouped":
        for role in ("image", "label"):
            if role + "s" in fields:
                for position, volume in enumerate(group_volumes(
                        {"encoding": {"name": "stack" if fields[role + "s"].ndim > 1 else "ragged"}},
                        fields[role + "s"], meta, role)):
                    out[f"{role}_{position:04d}"] = squeeze(np.ascontiguousarray(volume))
        meta["volumes"] = [{role: volume_meta(v) for role, v in volumes.items()} for volumes in meta["volumes"]]
    else:
        for name, value in fields.items():
            if name != "meta":
                out[name] = squeeze(value) if name.endswith("label") else value
        meta["volumes"] = {role: volume_meta(v) for role, v in meta["volumes"].items()}
    return out


def deepreg_stage(split: str):
    kind = split.split("_")[0]
    if kind == "paired":
        return wdsprep.deepreg.pairs(kind, moving_image_shape=(8, 8, 8), fixed_image_shape=(6, 6, 6), seed=0)
    return wdsprep.deepreg.pairs(kind, image_shape=(8, 8, 8), seed=0, sample_label="all")


def test_deepreg_1_shards_still_read_to_the_same_pairs(shard_sets, tmp_path):
    older = rewrite_shards(shard_sets["deepreg"], tmp_path / "v1", deepreg_v1)
    for split in splits_of(shard_sets["deepreg"]):
        if not split.endswith("train"):
            continue
        now, before = stream(shard_sets["deepreg"], split, deepreg_stage(split)), stream(older, split, deepreg_stage(split))
        assert len(now) == len(before) > 0, split
        for a, b in zip(now, before):
            same(b, a, split, exact_dtype=True)


def test_a_grouped_split_of_several_shapes_is_ragged_and_every_reader_gets_its_volumes(tmp_path, hf):
    """Volumes of different shapes in one group: the table says `ragged`, HF loads it, the volumes undone
    from the table are the files', and DeepReg's pairs equal those of the older per-position layout."""
    datasets, cache = hf
    from wdsprep.conversion import convert

    rng = np.random.default_rng(3)
    root = tmp_path / "g" / "train"
    root.mkdir(parents=True)
    with h5py.File(root / "images.h5", "w") as handle:
        for group, shapes in enumerate([[(5, 6, 7), (6, 6, 6)], [(4, 5, 6), (5, 6, 7), (7, 5, 4)]], start=1):
            for time, shape in enumerate(shapes, start=1):
                handle[f"group-{group}-{time}"] = rng.random(shape).astype(np.float32)
    manifest = convert("deepreg", str(tmp_path / "g"), str(tmp_path / "out"), shard_bytes="1MB")
    entry = manifest.tables["fields"]["train"]["images.npy.zst"]
    assert entry["encoding"]["name"] == "ragged" and entry["shape"] == [None]
    files = wdsprep.urls(str(tmp_path / "out" / "manifest.json"), "train")
    rows = list(datasets.load_dataset("webdataset", data_files={"train": files}, split="train", cache_dir=cache))
    assert len(rows) == 2
    with h5py.File(root / "images.h5", "r") as handle:
        for row in rows:
            volumes = group_volumes(entry, row["images.npy.zst"], row["meta.mp"], "image")
            for volume, name in zip(volumes, row["meta.mp"]["names"]):
                np.testing.assert_array_equal(volume, handle[name][()])
    older = rewrite_shards(tmp_path / "out" / "manifest.json", tmp_path / "v1", deepreg_v1)
    stage = lambda: wdsprep.deepreg.pairs("grouped", image_shape=(4, 4, 4), labeled=False, seed=0,  # noqa: E731
                                          intra_group_prob=0.5)
    now, before = stream(tmp_path / "out" / "manifest.json", "train", stage()), stream(older, "train", stage())
    assert len(now) == len(before) > 0
    for a, b in zip(now, before):
        same(b, a, "ragged", exact_dtype=True)


def test_ray_files_without_the_optional_ids_still_make_one_schema(tmp_path, hf):
    """Some ray files lack `face_ids`/`view_ids`: their samples hold the declared zero-length int32 arrays,
    the split still has one schema (HF loads it), and the reader leaves those keys out as before."""
    datasets, cache = hf
    from tests.voxels.voxels_testdata import make_tiny
    from wdsprep.conversion import convert

    native = pathlib.Path(make_tiny(tmp_path / "native", seed=2))
    stripped = set()
    for ray_file in sorted((native / "ray_dataset_hierarchical").glob("level_*/*/*_rays.npz"))[::3]:
        with np.load(ray_file) as archive:
            arrays = {name: archive[name] for name in archive.files if name not in ("face_ids", "view_ids")}
        np.savez(ray_file, **arrays)
        stripped.add(ray_file.name[: -len("_rays.npz")])
    manifest = convert("voxels", str(native), str(tmp_path / "out"), shard_bytes="1MB")
    for split, table in manifest.tables["fields"].items():
        assert field_table_problems(table) == [], split
        columns = table["rays.npz.zst"]["columns"]
        assert columns["face_ids"]["dtype"] == "<i4" and columns["face_ids"]["shape"] == [None]
        assert "zero-length" in columns["face_ids"]["absent"]
        files = wdsprep.urls(str(tmp_path / "out" / "manifest.json"), split)
        rows = list(datasets.load_dataset("webdataset", data_files={split: files}, split=split, cache_dir=cache))
        lacking = [row for row in rows if row["meta.mp"]["key"] in stripped]
        assert lacking and len(lacking) < len(rows)
        for row in lacking:
            assert row["rays.npz.zst"]["face_ids"] == [] and "face_ids" not in row["meta.mp"]["ray_fields"]
        chunks = stream(tmp_path / "out" / "manifest.json", split, wdsprep.voxels.samples(include_empty=True))
        assert {("face_ids" in c, c["hash"].split("_")[-1] in stripped) for c in chunks} == {(False, True), (True, False)}
