"""Every bad input is one line naming the file and the rule broken, exit 1, and no partial output
(generic source here; each source's folder covers its own formats)."""
import json
import os
import re

import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wdsprep.cli import main
from wdsprep.conversion import _describe_items
from wdsprep.errors import InputError
from wdsprep.sources.base import read_json_file, read_npy_file


def _good(root, count=3):
    os.makedirs(root / "train", exist_ok=True)
    for i in range(count):
        np.save(root / "train" / f"k{i}.array.npy", np.arange(4, dtype=np.float32) + i)
        (root / "train" / f"k{i}.meta.json").write_text(json.dumps({"i": i}))


def _dangling(root):
    os.symlink(root / "nowhere.npy", root / "train" / "k9.array.npy")
    return root / "train" / "k9.array.npy", "dangling symbolic link"


def _zero_byte(root):
    (root / "train" / "k1.array.npy").write_bytes(b"")
    return root / "train" / "k1.array.npy", r"empty file \(0 bytes\), expected a .npy array"


def _text_as_npy(root):
    (root / "train" / "k1.array.npy").write_text("just some text, not an array\n")
    return root / "train" / "k1.array.npy", r"not a .npy file \(does not start with the \\x93NUMPY magic\)"


def _truncated_npy(root):
    path = root / "train" / "k1.array.npy"
    path.write_bytes(path.read_bytes()[:-5])
    return path, r"truncated or malformed .npy"


def _object_npy(root):
    np.save(root / "train" / "k1.array.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return root / "train" / "k1.array.npy", r"holds pickled \(object\) data; only plain arrays are read"


def _bad_json(root):
    (root / "train" / "k2.meta.json").write_text("{'single': quotes}")
    return root / "train" / "k2.meta.json", "not valid JSON"


def _not_utf8_json(root):
    (root / "train" / "k2.meta.json").write_bytes(b"\xff\xfe{}")
    return root / "train" / "k2.meta.json", "not valid JSON"


def _json_beyond_64_bits(root):
    (root / "train" / "k2.meta.json").write_text(json.dumps({"count": 2**64}))  # msgpack holds -2**63 .. 2**64-1
    return root / "train" / "k2.meta.json", r"a value a shard cannot hold .*integers must lie within"


def _json_nested_too_deeply(root):
    (root / "train" / "k2.meta.json").write_text("[" * 100_000 + "]" * 100_000)
    return root / "train" / "k2.meta.json", r"not valid JSON \(nested deeper than 100 levels\)"


def _json_duplicate_key(root):
    (root / "train" / "k2.meta.json").write_text('{"label": 1, "nested": {"a": 1, "a": 2}}')  # json keeps the last silently
    return root / "train" / "k2.meta.json", r"not valid JSON \(duplicate key 'a' in one object\)"


def _npy_header_asks_for_too_much(root):
    path = root / "train" / "k1.array.npy"
    data = path.read_bytes()
    huge = data.replace(b"(4,), }" + b" " * 16, b"(99999999999999999,), }")  # same header length
    assert len(huge) == len(data) and huge != data
    path.write_bytes(huge)
    return path, r"truncated or malformed .npy"


def _directory_as_file(root):
    (root / "train" / "k1.array.npy").unlink()
    (root / "train" / "k1.array.npy").mkdir()
    return root / "train" / "k1.array.npy", "not a regular file"


def _same_field_twice(root):
    (root / "train" / "k1.array.json").write_text("[1, 2]")
    return root / "train" / "k1.array.json", r"field 'array' of sample 'k1' is given twice"


CASES = {f.__name__[1:]: f for f in (_dangling, _zero_byte, _text_as_npy, _truncated_npy, _object_npy, _bad_json,
                                      _not_utf8_json, _json_beyond_64_bits, _json_nested_too_deeply, _json_duplicate_key,
                                      _npy_header_asks_for_too_much, _directory_as_file, _same_field_twice)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_input_is_one_line_naming_the_file_exit_1_and_no_output(tmp_path, capsys, case):
    native, out = tmp_path / "in", tmp_path / "out"
    _good(native)
    path, rule = CASES[case](native)
    assert main(["convert", "generic", str(native), str(out), "--quiet"]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    if case == "same_field_twice":  # names both files
        assert lines[0].startswith(f"wdsprep: error: {path} and {native / 'train' / 'k1.array.npy'}: ")
    else:
        assert lines[0].startswith(f"wdsprep: error: {path}: "), lines[0]
    assert re.search(rule, lines[0]), lines[0]
    assert [name for name in os.listdir(out) if name != ".wdsprep.lock"] == []


def test_a_unit_failure_names_the_item_count_and_the_first_item_only():
    items = [[f"/data/in/train/sample{i:06d}", "train", f"sample{i:06d}", ["a.npy", "b.json"]] for i in range(40)]
    text = _describe_items(items)
    assert text.startswith('40 items, first ["/data/in/train/sample000000"') and len(text) < 120
    assert "sample000001" not in text
    assert _describe_items(items[:1]).startswith("1 item, first")


def test_skip_mode_drops_the_bad_samples_lists_them_and_converts_the_rest(tmp_path):
    import wdsprep
    from wdsprep.conversion import convert

    native = tmp_path / "in"
    _good(native, count=7)
    train = native / "train"
    (train / "k1.array.npy").write_bytes(b"")
    (train / "k2.meta.json").write_text("{'single': quotes}")
    (train / "k4.array.npy").write_text("text\n")
    (train / "k5.array.json").write_text("[1]")
    os.symlink(train / "nowhere.npy", train / "k9.array.npy")
    manifest = convert("generic", str(native), str(tmp_path / "out"), on_error="skip")
    items = sorted(problem["item"] for problem in manifest.problems)
    assert items == sorted([str(train / "k1.array.npy"), str(train / "k2.meta.json"), str(train / "k4.array.npy"),
                            f"{train / 'k5.array.json'} and {train / 'k5.array.npy'}", str(train / "k9.array.npy")])
    keys = [s["__key__"] for s in wdsprep.dataset(str(tmp_path / "out"), "train", shuffle_shards=False)]
    assert sorted(keys) == ["k0", "k3", "k6"]


def _npy_bytes():
    buffer = io.BytesIO()
    np.save(buffer, np.arange(12, dtype=np.float32).reshape(3, 4))
    return buffer.getvalue()


NPY = _npy_bytes()
JSON = json.dumps({"index": 7, "label": [1, 2, {"x": None}], "name": "k7"}).encode()
DAMAGE = st.tuples(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
                   st.one_of(st.none(), st.integers(0, 10**6)))


def _damaged(data: bytes, damage) -> bytes:
    edits, cut = damage
    out = bytearray(data)
    for position, value in edits:
        out[position % len(out)] = value
    return bytes(out[: cut % len(out)] if cut is not None else out)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage=DAMAGE, kind=st.sampled_from(["npy", "json"]))
def test_a_damaged_array_or_json_file_reads_or_is_one_input_error_naming_it(tmp_path, damage, kind):
    """Whatever numpy's header parser or json meets (bytes changed anywhere, the file cut short), the
    reader returns a value or raises InputError naming the file: never another exception."""
    path = tmp_path / f"k0.field.{kind}"
    path.write_bytes(_damaged(NPY if kind == "npy" else JSON, damage))
    try:
        (read_npy_file if kind == "npy" else read_json_file)(str(path))
    except InputError as error:
        assert str(error).startswith(f"{path}: "), error
