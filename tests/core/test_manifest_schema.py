"""A manifest is checked on load: each defect is one ManifestError line naming the manifest and the field."""
import copy
import json
import subprocess
import sys

import pytest

import wdsprep
import wdsprep.stream
from wdsprep.errors import ManifestError
from wdsprep.shards.manifest import Manifest

CLI = [sys.executable, "-m", "wdsprep"]


@pytest.fixture
def good(uneven_manifest):
    """A real manifest written by the writer (8 shards of 7 samples, the last of 1), as a dict."""
    with open(uneven_manifest) as handle:
        return uneven_manifest, json.load(handle)


def _write(path, data):
    with open(path, "w") as handle:
        json.dump(data, handle)


def _load_error(path, data) -> str:
    _write(path, data)
    with pytest.raises(ManifestError) as caught:
        wdsprep.urls(path, "train")
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message


def test_the_good_manifest_loads_and_keeps_unknown_optional_row_fields(good):
    path, data = good
    data["splits"]["train"]["shards"][0]["future_field"] = {"anything": [1]}
    _write(path, data)
    manifest = wdsprep.stream.load_manifest(path)
    assert manifest.samples("train") == 50
    assert manifest.shards("train")[0]["future_field"] == {"anything": [1]}


def test_a_lowered_sample_count_disagrees_with_the_split_total(good):
    path, data = good
    data["splits"]["train"]["shards"][1]["samples"] = 3
    message = _load_error(path, data)
    assert "splits.train.samples" in message and "says 50, but its shard rows add up to 46" in message


def test_a_lowered_count_with_lowered_totals_still_disagrees_with_the_overall_totals(good):
    path, data = good
    data["splits"]["train"]["shards"][1]["samples"] = 3
    data["splits"]["train"]["samples"] = 46
    assert "totals.samples" in _load_error(path, data)


@pytest.mark.parametrize("value", [-1, "7", 7.0, True, None])
def test_a_negative_or_wrongly_typed_count_is_named(good, value):
    path, data = good
    data["splits"]["train"]["shards"][0]["samples"] = value
    message = _load_error(path, data)
    assert "splits.train.shards[0].samples: expected a non-negative integer" in message


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "http://evil/train-00000-00.tar",
                                  "sub/train-00000-00.tar", "train-00000-00.tar/..", "valid-00000-00.tar",
                                  "train-0-0.tar", "train-00000-00.tar.gz"])
def test_shard_names_must_follow_the_shard_name_rule(good, name):
    path, data = good
    data["splits"]["train"]["shards"][0]["name"] = name
    message = _load_error(path, data)
    assert "splits.train.shards[0].name" in message and "shard-name rule" in message


@pytest.mark.parametrize("field, value", [
    ("bytes", "12"), ("sha256", 5), ("sha256", "ABC"), ("unit", -2), ("name", 3), ("unit_digest", 1),
])
def test_wrongly_typed_row_fields_are_named(good, field, value):
    path, data = good
    data["splits"]["train"]["shards"][2][field] = value
    assert f"splits.train.shards[2].{field}: expected" in _load_error(path, data)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(source=None), "source"),
    (lambda d: d.update(config=[]), "config"),
    (lambda d: d.update(splits=[]), "splits"),
    (lambda d: d.update(input_bytes=-5), "input_bytes"),
    (lambda d: d.pop("fingerprint"), "fingerprint: missing"),
    (lambda d: d["splits"]["train"].update(shards="x"), "splits.train.shards"),
    (lambda d: d["splits"]["train"]["shards"].append(copy.deepcopy(d["splits"]["train"]["shards"][0])), "listed twice"),
    (lambda d: d["splits"].update({"../x": d["splits"]["train"]}), "not a split name"),
    (lambda d: d["splits"]["train"]["shards"].__setitem__(0, "train-00000-00.tar"), "splits.train.shards[0]"),
])
def test_top_level_and_split_defects_are_named(good, mutate, field):
    path, data = good
    mutate(data)
    assert field in _load_error(path, data)


def test_duplicate_json_fields_are_refused(good):
    path, data = good
    text = json.dumps(data)
    text = text.replace('"source": "test"', '"source": "test", "source": "other"')
    with open(path, "w") as handle:
        handle.write(text)
    with pytest.raises(ManifestError, match="duplicate key 'source'"):
        wdsprep.stream.load_manifest(path)


def test_from_dict_is_the_one_schema(good):
    _, data = good
    data["splits"]["train"]["shards"][0]["samples"] = "7"
    with pytest.raises(ManifestError, match=r"^manifest: splits.train.shards\[0\].samples"):
        Manifest.from_dict(data)


def test_the_cli_reports_a_bad_manifest_in_one_line(good):
    path, data = good
    data["splits"]["train"]["shards"][0]["samples"] = "7"
    _write(path, data)
    for command in ("inspect", "verify"):
        result = subprocess.run(CLI + [command, path], capture_output=True, text=True)
        assert result.returncode == 1
        assert result.stderr.strip().splitlines() == [
            f"wdsprep: error: {path}: splits.train.shards[0].samples: expected a non-negative integer (got '7')"
        ]
