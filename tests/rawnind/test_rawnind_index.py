"""The index YAML and the Dataverse listing: the real files, the dry-run plan and bad input."""
import json

import pytest

from wdsprep.errors import InputError
from wdsprep.cli import main
from wdsprep.sources.rawnind.index import build_scenes, load_index, load_listing, parse_index, plan_summary
from wdsprep.testing.dataverse import DataverseServer

REAL_DOI = "doi:10.14428/DVN/DEQCIM"


def _check_real_plan(plan):
    # counts from the research notes A.3 and the real listing (2845 files, ~120.2 GB)
    assert plan["scenes"] == 307
    assert plan["scenes_by_cfa"] == {"Bayer": 196, "X-Trans": 111}
    assert plan["test_reserve_scenes"] == 16
    assert plan["index_entries"] == 2837  # 435+1739 Bayer + 132+531 X-Trans
    assert plan["sidecars"] == 11  # the .xmp entries
    assert plan["files"] == 2827
    assert plan["bytes"] == 119_893_728_176
    assert len(plan["unmatched"]) == 10 and all(name.endswith(".xmp") for name in plan["unmatched"])
    assert plan["listing_files"] == 2845
    assert plan["listing_bytes"] == 120_172_531_162
    not_in_index = plan["listing_not_in_index"]
    assert len(not_in_index) == 18  # 15 X-Trans captures + dataset.yaml, test_reserve.yaml, permissions.txt
    assert sum(name.startswith("X-Trans_") for name in not_in_index) == 15


def test_real_index_and_listing_plan(shared_data):
    index = load_index(str(shared_data / "rawnind" / "dataset_index.yaml"))
    listing = load_listing(str(shared_data / "rawnind" / "dataverse_dataset.json"))
    scenes = build_scenes(index, listing)
    _check_real_plan(plan_summary(scenes, listing))
    bayer = build_scenes(index, listing, cfa="Bayer")
    assert sum(len(scene.clean) + len(scene.sidecars) for scene in bayer) == 435
    assert sum(len(scene.noisy) for scene in bayer) == 1739
    assert sum(scene.unknown_sensor for scene in bayer) == 11
    two = build_scenes(index, listing, max_scenes=2)
    assert [scene.name for scene in two] == ["2pilesofplates", "7D-1"]
    # scene names with "_" come from the YAML, not from the file names
    assert any(scene.name == "LucieB_bw_drawing1" for scene in bayer)


def test_dry_run_cli_on_real_files(shared_data, tmp_path, capsys):
    code = main(["fetch", "rawnind", str(tmp_path / "dest"), "--dry-run", "--json",
                 "--index", str(shared_data / "rawnind" / "dataset_index.yaml"),
                 "--listing", str(shared_data / "rawnind" / "dataverse_dataset.json")])
    assert code == 0
    out = capsys.readouterr().out
    assert "scenes: 307" in out and "files to fetch: 2827 (119893728176 bytes" in out
    assert "index entries with no Dataverse id: 10" in out
    _check_real_plan(json.loads(out.strip().splitlines()[-1]))
    assert not (tmp_path / "dest").exists()  # a dry run writes nothing


def test_dry_run_through_the_local_server_with_the_real_listing(shared_data, tmp_path, capsys):
    with DataverseServer(str(shared_data / "rawnind")) as server:
        assert server.doi == REAL_DOI
        code = main(["fetch", "rawnind", str(tmp_path / "dest"), "--dry-run", "--json", "--dataverse", server.url,
                     "--index", str(shared_data / "rawnind" / "dataset_index.yaml")])
        assert code == 0
        _check_real_plan(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
        assert any(entry["path"].startswith("/api/datasets/:persistentId") for entry in server.log)
        # filtered plan: one CFA, a scene limit
        code = main(["fetch", "rawnind", str(tmp_path / "dest"), "--dry-run", "--json", "--dataverse", server.url,
                     "--index", str(shared_data / "rawnind" / "dataset_index.yaml"), "--cfa", "X-Trans", "--max-scenes", "3"])
        plan = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert plan["scenes"] == 3 and plan["scenes_by_cfa"] == {"X-Trans": 3}


@pytest.mark.parametrize(
    "text, message",
    [
        ("- just a list\n", "expected a mapping of CFA type"),
        ("Bayer:\n  s1:\n    noisy_images: []\n", "Bayer/s1: missing list 'clean_images'"),
        ("Bayer:\n  s1:\n    clean_images:\n    - {filename: a.arw, sha1: xyz}\n    noisy_images: []\n",
         "Bayer/s1: clean_images[0]: sha1 'xyz' is not 40 hex digits"),
        ("Bayer: [\n", "not valid YAML"),
    ],
)
def test_bad_index_names_file_and_rule(text, message):
    with pytest.raises(InputError, match="dataset_index.yaml: .*" + message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        parse_index(text, "dataset_index.yaml")


def test_bad_index_stops_fetch_with_one_message(tmp_path, capsys, synth_tiny):
    bad = tmp_path / "bad.yaml"
    bad.write_text("Bayer:\n  s1:\n    clean_images: 3\n    noisy_images: []\n")
    code = main(["fetch", "rawnind", str(tmp_path / "dest"), "--index", str(bad), "--listing", str(synth_tiny / "dataverse_dataset.json")])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"wdsprep: error: {bad}: Bayer/s1: missing list 'clean_images'"]


def test_fetch_against_the_real_listing_reports_missing_files(shared_data, tmp_path, capsys):
    """The local server serves the real dataset JSON (no captures on disk): every file is a 404,
    reported per file with its reason, and the run ends with exit code 1."""
    with DataverseServer(str(shared_data / "rawnind")) as server:
        code = main(["fetch", "rawnind", str(tmp_path / "dest"), "--dataverse", server.url,
                     "--index", str(shared_data / "rawnind" / "dataset_index.yaml"),
                     "--scenes", "7D-1", "LucieB_board", "--progress", "none", "--backoff", "0.01"])
        assert server.wait_idle()  # a request is logged after its answer went out
        requested = [entry for entry in server.log if entry.get("file_id")]
    assert code == 1
    report = json.loads((tmp_path / "dest" / "fetch_report.json").read_text())
    index = load_index(str(shared_data / "rawnind" / "dataset_index.yaml"))
    expected = [entry["filename"] for name in ("7D-1", "LucieB_board")
                for entry in index["Bayer"][name]["clean_images"] + index["Bayer"][name]["noisy_images"]]
    xmp = [name for name in expected if name.endswith(".xmp")]
    assert len(xmp) == 1 and report["unmatched"] == xmp
    assert sorted(f["file"] for f in report["failed"]) == sorted(set(expected) - set(xmp))
    assert all("HTTP 404" in f["reason"] and f["attempts"] == 1 for f in report["failed"])
    assert len(requested) == len(expected) - 1  # one request per file, no retry of a 404
    assert report["scenes"]["complete"] == 0 and len(report["scenes"]["incomplete"]) == 2
    assert (tmp_path / "dest" / "dataset_metadata.json").read_bytes() == (shared_data / "rawnind" / "dataverse_dataset.json").read_bytes()
    assert "failed: " in capsys.readouterr().err


SCENE = "    clean_images:\n    - {filename: a.arw, sha1: " + "0" * 40 + "}\n    noisy_images: []\n"


def test_a_scene_given_twice_is_refused():
    """PyYAML keeps the last of two equal keys silently: the first scene's captures would vanish."""
    text = "Bayer:\n  s1:\n" + SCENE + "  s1:\n" + SCENE
    with pytest.raises(InputError, match=r"^dataset_index.yaml: not valid YAML \(.*duplicate key 's1' in one mapping"):
        parse_index(text, "dataset_index.yaml")


def test_an_alias_bomb_is_refused_before_it_is_walked():
    """Nine levels of ten aliases each: 1 kB of text, 10**9 values for whoever walks it (a scene's
    extra key: the index's own checks never look there). Counted on the shared objects."""
    import tracemalloc

    lines = ["a0: &a0 [x]"] + [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 10)}]" for n in range(1, 10)]
    text = "Bayer:\n  s1:\n" + SCENE + "    extra:\n" + "".join(f"      {line}\n" for line in lines)
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=r"^dataset_index.yaml: holds more than \d+ values once its aliases are expanded"):
            parse_index(text, "dataset_index.yaml")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(text) < 2000 and peak < 4 << 20, peak


def test_a_structure_holding_itself_is_refused():
    text = "Bayer:\n  s1:\n" + SCENE + "    extra: &loop [*loop]\n"
    with pytest.raises(InputError, match="a structure that contains itself"):
        parse_index(text, "dataset_index.yaml")


def test_a_listing_naming_a_key_twice_is_refused(tmp_path):
    path = tmp_path / "dataverse_dataset.json"
    path.write_text('{"data": {"latestVersion": {"files": []}, "latestVersion": {"files": []}}}')
    with pytest.raises(InputError, match=rf"^{path}: not valid JSON \(duplicate key 'latestVersion' in one object\)$"):
        load_listing(str(path))
