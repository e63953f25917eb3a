"""The acquisition pipeline against the local Dataverse server, with injected faults."""
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import trio
import yaml

from tests.timeouts import EVENT
from wdsprep.progress import human_bytes
from wdsprep.cli import main
from wdsprep.sources.rawnind.acquire.fetch import Fetcher, FetchOptions
from wdsprep.testing.dataverse import DataverseServer, Faults
from wdsprep.sources.rawnind.index import build_scenes, load_index, load_listing
from wdsprep.sources.rawnind.synth import SYNTH_DOI

from .rawnind_testdata import truth


def run_fetch(options: FetchOptions, limit: float = EVENT) -> dict:
    """Run the pipeline; fail the test if it does not end on its own within `limit` seconds."""

    async def bounded():
        with trio.fail_after(limit):
            return await Fetcher(options).run()

    return trio.run(bounded)


def sha1(path) -> str:
    return hashlib.sha1(open(path, "rb").read()).hexdigest()


def size_or_zero(path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # renamed by the fetch in between
        return 0


def scene_files(root):
    index = load_index(str(root / "dataset_index.yaml"))
    listing = load_listing(str(root / "dataverse_dataset.json"))
    return [image for scene in build_scenes(index, listing) for image in scene.files]


def test_clean_fetch_verifies_everything_and_second_run_skips(synth_tiny, tmp_path):
    dest = tmp_path / "dest"
    with DataverseServer(str(synth_tiny)) as server:
        report = run_fetch(FetchOptions(dest=str(dest), dataverse=server.url, doi=SYNTH_DOI, progress="none"))
        images = [image for image in scene_files(synth_tiny) if image.downloadable]
        assert sorted(report["verified"]) == sorted(image.filename for image in images)
        assert report["failed"] == [] and report["unmatched"] == [image.filename for image in scene_files(synth_tiny) if image.role == "sidecar"]
        assert report["scenes"] == {"total": 2, "complete": 2, "incomplete": []}
        for image in images:
            path = dest / image.relpath
            assert sha1(path) == image.sha1
            assert ("/gt/" in image.relpath) == (image.role == "clean")
        assert not list(dest.rglob("*.part"))
        assert json.loads((dest / "fetch_report.json").read_text())["verified"] == report["verified"]
        assert (dest / "dataset_index.yaml").read_bytes() == (synth_tiny / "files" / "dataset.yaml").read_bytes()
        # upstream's pairs: plants 1 clean x (1 clean + 2 noisy), book_shelf 2 clean x (2 clean + 2 noisy)
        assert report["metadata"]["pairs_computed"] == 3 + 8
        assert server.wait_idle()  # a request is logged after its answer went out
        requests_before = len(server.log)
        again = run_fetch(FetchOptions(dest=str(dest), dataverse=server.url, doi=SYNTH_DOI, progress="none"))
        assert again["verified"] == [] and len(again["skipped"]) == len(images)
        assert again["metadata"]["pairs_computed"] == 0  # cached
        assert server.wait_idle()
        fetched_again = [entry for entry in server.log[requests_before:] if entry.get("file", "").endswith(".dng")]
        assert fetched_again == []


def test_injected_faults(synth_tiny, tmp_path):
    downloadable = {image.filename: image for image in scene_files(synth_tiny) if image.downloadable}
    files = {name: image for name, image in downloadable.items() if name.endswith(".dng")}
    names = sorted(files)
    flaky_500, dropped, corrupt_once, corrupt_always, missing, slow, too_slow = names[:7]
    faults = Faults(
        error_500={flaky_500: 2},
        drop_after={dropped: (50_000, 1)},
        corrupt={corrupt_once: 1, corrupt_always: -1},
        missing={missing},
        delay={slow: 0.3, too_slow: 2.0},
    )
    dest = tmp_path / "dest"
    log = io.StringIO()
    with DataverseServer(str(synth_tiny), faults=faults) as server:
        report = run_fetch(FetchOptions(dest=str(dest), dataverse=server.url, doi=SYNTH_DOI, backoff=0.05,
                                        timeout=1.0, progress="log", log_interval=0.2, stream=log))
    failed = {entry["file"]: entry for entry in report["failed"]}
    assert set(failed) == {corrupt_always, missing, too_slow}
    assert "SHA-1 mismatch" in failed[corrupt_always]["reason"] and failed[corrupt_always]["attempts"] == 3
    assert "HTTP 404" in failed[missing]["reason"] and failed[missing]["attempts"] == 1
    assert "Timeout" in failed[too_slow]["reason"] and failed[too_slow]["attempts"] == 3
    good = set(names) - set(failed)
    assert good <= set(report["verified"])
    # nothing is ever verified with a wrong hash; failed files leave nothing at their final name
    assert set(report["verified"]) <= set(downloadable)
    for name in report["verified"]:
        assert sha1(dest / downloadable[name].relpath) == downloadable[name].sha1, name
    for name in failed:
        assert not (dest / files[name].relpath).exists()
        assert not os.path.exists(str(dest / files[name].relpath) + ".part") or name == too_slow
    assert server.wait_idle()  # a request is logged after its answer went out
    requests = sorted((entry for entry in server.log if entry.get("file")), key=lambda entry: entry["time"])
    statuses = [entry["status"] for entry in requests if entry["file"] == flaky_500]
    assert statuses == [500, 500, 200]
    resumed = [entry for entry in requests if entry["file"] == dropped and entry["range"]]
    assert resumed and resumed[0]["range"] == "bytes=50000-" and resumed[0]["status"] == 206
    assert sum(entry["file"] == corrupt_once for entry in requests) == 2
    assert report["scenes"]["complete"] + len(report["scenes"]["incomplete"]) == 2
    assert "[rawnind fetch]" in log.getvalue() and "done:" in log.getvalue()


def test_progress_bar_on_a_terminal(synth_tiny, tmp_path):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    with DataverseServer(str(synth_tiny), faults=Faults(rate_limit=300_000)) as server:
        run_fetch(FetchOptions(dest=str(tmp_path / "d"), dataverse=server.url, doi=SYNTH_DOI, metadata=False, stream=screen))
    text = screen.getvalue()
    assert "\r\x1b[K" in text and "active" in text and "B/s" in text
    assert "%]" in text  # an active transfer with its percentage


def test_kill_mid_download_then_resume_by_range(synth_tiny, tmp_path):
    dest = tmp_path / "dest"
    server_log = tmp_path / "server.log"
    images = {image.filename: image for image in scene_files(synth_tiny) if image.downloadable}
    # ~1 s per 196 kB capture, one at a time
    with DataverseServer(str(synth_tiny), faults=Faults(rate_limit=200_000), log_path=str(server_log)) as server:
        command = [sys.executable, "-m", "wdsprep", "fetch", "rawnind", str(dest), "--dataverse", server.url,
                   "--doi", SYNTH_DOI, "--concurrency", "1", "--no-metadata", "--progress", "none"]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + EVENT
            while time.monotonic() < deadline:
                finals = [p for p in dest.rglob("*.dng")]
                parts = [size for size in map(size_or_zero, dest.rglob("*.part")) if 30_000 < size < 150_000]
                if finals and parts:
                    break
                assert process.poll() is None, process.stderr.read()
                time.sleep(0.02)
            else:
                pytest.fail("the fetch never had a verified file and a partial one")
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=EVENT)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        assert server.wait_idle(EVENT)  # the killed transfer's request is logged before the second run
        verified_before = {p.name for p in dest.rglob("*.dng")}
        partial = {p.name[: -len(".part")]: p.stat().st_size for p in dest.rglob("*.part")}
        assert verified_before and partial
        requests_before = len(server.log)
        server.faults.rate_limit = None
        report = run_fetch(FetchOptions(dest=str(dest), dataverse=server.url, doi=SYNTH_DOI, metadata=False, progress="none"))
        assert server.wait_idle()
        second = [entry for entry in server.log[requests_before:] if entry.get("file") in images]
    assert not {entry["file"] for entry in second} & verified_before  # nothing verified is fetched twice
    assert set(report["skipped"]) == verified_before
    for name, size in partial.items():
        resumed = [entry for entry in second if entry["file"] == name]
        assert [entry["range"] for entry in resumed] == [f"bytes={size}-"]
        assert resumed[0]["status"] == 206
    assert report["failed"] == []
    for name, image in images.items():
        assert sha1(dest / image.relpath) == image.sha1
    # the server's JSON-lines log shows the resumed request too
    lines = [json.loads(line) for line in server_log.read_text().splitlines()]
    assert any(line.get("range") == f"bytes={size}-" for line in lines for size in partial.values())


def test_unreachable_server_stops_at_once(tmp_path, capsys):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = main(["fetch", "rawnind", str(tmp_path / "dest"), "--dataverse", f"http://127.0.0.1:{port}", "--timeout", "2"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"wdsprep: error: cannot reach Dataverse at http://127.0.0.1:{port}/api/datasets")


def test_unreachable_server_with_local_listing_and_index_stops_at_once(synth_tiny, tmp_path, capsys, monkeypatch):
    """Nothing is fetched before the downloads: the server is probed once, not found after all retries
    ("at once" is observed as no retry backoff slept, not as elapsed time)."""
    import socket

    slept = []
    real_sleep = trio.sleep

    async def recording_sleep(seconds):
        slept.append(seconds)
        await real_sleep(seconds)

    monkeypatch.setattr(trio, "sleep", recording_sleep)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dest = tmp_path / "dest"
    code = main(["fetch", "rawnind", str(dest), "--dataverse", f"http://127.0.0.1:{port}", "--doi", SYNTH_DOI,
                 "--listing", str(synth_tiny / "dataverse_dataset.json"), "--index", str(synth_tiny / "dataset_index.yaml"),
                 "--timeout", "2", "--backoff", "5", "--progress", "none"])
    assert code == 1
    assert [s for s in slept if s >= 5] == []  # a retry would have slept the 5 s backoff first
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"wdsprep: error: cannot reach Dataverse at http://127.0.0.1:{port}/api/datasets")
    assert not list(dest.rglob("*.dng")) and not list(dest.rglob("*.part"))


def test_a_file_that_cannot_be_written_is_a_reported_failure(synth_tiny, tmp_path):
    """An OSError on the .part (here a directory in its way) fails that file only, with its name."""
    images = sorted((image for image in scene_files(synth_tiny) if image.downloadable), key=lambda image: image.filename)
    victim = images[0]
    dest = tmp_path / "dest"
    blocked = dest / (victim.relpath + ".part")
    blocked.mkdir(parents=True)
    (blocked / "keep").write_text("x")  # not removable as a file either
    with DataverseServer(str(synth_tiny)) as server:
        report = run_fetch(FetchOptions(dest=str(dest), dataverse=server.url, doi=SYNTH_DOI, metadata=False,
                                        progress="none", backoff=0.01))
    [failure] = report["failed"]
    assert failure["file"] == victim.filename
    assert failure["reason"].startswith("cannot write ") and victim.filename in failure["reason"]
    assert sorted(report["verified"]) == sorted(image.filename for image in images[1:])
    assert not (dest / victim.relpath).exists()


def test_unwritable_destination_stops_at_once(synth_tiny, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with DataverseServer(str(synth_tiny)) as server:
        code = main(["fetch", "rawnind", str(blocker / "dest"), "--dataverse", server.url, "--doi", SYNTH_DOI])
        assert code == 1
        assert [entry for entry in server.log] == []  # nothing was even asked
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "destination is not writable" in err[0] and str(blocker / "dest") in err[0]


def test_wrong_doi_is_a_clear_error(synth_tiny, tmp_path, capsys):
    with DataverseServer(str(synth_tiny)) as server:
        code = main(["fetch", "rawnind", str(tmp_path / "d"), "--dataverse", server.url, "--doi", "doi:10.1/NOPE"])
    assert code == 1
    assert "HTTP 404 while fetching the dataset doi:10.1/NOPE" in capsys.readouterr().err


def test_selection_by_scene_and_cli_exit_code(synth_tiny, tmp_path, capsys):
    names = list(yaml.safe_load((synth_tiny / "dataset_index.yaml").read_text())["Bayer"])
    missing_name = sorted(truth(synth_tiny)["scenes"][f"Bayer/{names[1]}"]["noisy"])[0]
    with DataverseServer(str(synth_tiny), faults=Faults(missing={missing_name})) as server:
        code = main(["fetch", "rawnind", str(tmp_path / "d"), "--dataverse", server.url, "--doi", SYNTH_DOI, "--scenes", names[1],
                     "--progress", "none", "--no-metadata"])
        assert code == 1  # a reported failure
        out = capsys.readouterr()
        assert f"failed: {missing_name}: HTTP 404" in out.err
        report = json.loads((tmp_path / "d" / "fetch_report.json").read_text())
        assert report["scenes"]["incomplete"] == [{"scene": f"Bayer/{names[1]}", "missing": [missing_name]}]
        assert all(names[1] in name for name in report["verified"])
        code = main(["fetch", "rawnind", str(tmp_path / "d"), "--dataverse", server.url, "--doi", SYNTH_DOI, "--scenes", "nope"])
        assert code == 1 and "scenes not in the index: nope" in capsys.readouterr().err


class _OverlapServer(DataverseServer):
    """Notes when each request's answer ended, so the test can count downloads the server answered at once."""

    def record(self, entry: dict) -> None:
        entry["ended"] = time.time()  # same clock as the entry's start ("time"); only the order matters
        super().record(entry)

    def most_simultaneous_downloads(self) -> int:
        events = sorted((t, step) for e in self.log if e.get("file") and e.get("status") == 200
                        for t, step in ((e["time"], 1), (e["ended"], -1)))
        peak = active = 0
        for _, step in events:  # an end sorts before a start at the same instant: touching is not overlapping
            active += step
            peak = max(peak, active)
        return peak


def test_concurrency_downloads_that_many_files_at_once_at_the_server(synth_tiny, tmp_path):
    """The bench's claim in small, measured by what the server saw (not by time): against a
    per-connection rate limit (~1 s per file), concurrency=5 keeps 5 downloads open at once, concurrency=1 one."""
    peaks = {}
    for concurrency in (1, 5):
        faults = Faults(rate_limit=200_000) if concurrency > 1 else None  # one at a time cannot overlap anyway
        with _OverlapServer(str(synth_tiny), faults=faults) as server:
            report = run_fetch(FetchOptions(dest=str(tmp_path / f"c{concurrency}"), dataverse=server.url, doi=SYNTH_DOI,
                                            concurrency=concurrency, metadata=False, progress="none"), limit=EVENT)
            assert server.wait_idle(EVENT)
            assert report["failed"] == [] and len(report["verified"]) == 7
            downloads = [e["file"] for e in server.log if e.get("file") and e.get("status") == 200]
            assert set(report["verified"]) <= set(downloads), downloads
            peaks[concurrency] = server.most_simultaneous_downloads()
    assert peaks == {1: 1, 5: 5}


def test_a_scene_whose_metadata_fails_is_reported_not_fatal(synth_tiny, tmp_path):
    """A noisy capture of the wrong size: files verify, metadata reports the scene, the run ends."""
    import shutil

    import numpy as np

    from wdsprep.sources.rawnind.dng import write_dng

    served = tmp_path / "served"
    shutil.copytree(synth_tiny, served)
    listing = json.loads((served / "dataverse_dataset.json").read_text())
    index_text = (served / "dataset_index.yaml").read_text()
    victim = sorted(truth(synth_tiny)["scenes"]["Bayer/plants"]["noisy"])[0]
    (served / "files" / victim).unlink()
    temporary = served / "files" / "small.dng"
    write_dng(str(temporary), np.full((64, 64), 1000, dtype=np.uint16), black_level=512, white_level=16383, iso=800)
    data = temporary.read_bytes()
    new_sha1 = hashlib.sha1(data).hexdigest()
    new_name = victim.split("_sha1=")[0] + f"_sha1={new_sha1}.dng"
    temporary.rename(served / "files" / new_name)
    old_sha1 = victim.split("_sha1=")[1][:40]
    index_text = index_text.replace(victim, new_name).replace(f"sha1: {old_sha1}", f"sha1: {new_sha1}")
    for name in ("dataset_index.yaml", "files/dataset.yaml"):
        (served / name).write_text(index_text)
    for entry in listing["data"]["latestVersion"]["files"]:
        datafile = entry["dataFile"]
        if datafile["filename"] == victim:
            datafile["filename"] = entry["label"] = new_name
            datafile["filesize"] = len(data)
        if datafile["filename"] == "dataset.yaml":
            datafile["filesize"] = len(index_text.encode())
    (served / "dataverse_dataset.json").write_text(json.dumps(listing))
    with DataverseServer(str(served)) as server:
        report = run_fetch(FetchOptions(dest=str(tmp_path / "d"), dataverse=server.url, doi=SYNTH_DOI, progress="none"))
    assert report["failed"] == [] and new_name in report["verified"]
    assert report["metadata"]["scenes"] == 1
    [problem] = report["metadata"]["problems"]
    assert problem["scene"] == "Bayer/plants" and new_name in problem["reason"] and "cannot pair" in problem["reason"]


def test_the_bytes_reported_and_shown_are_the_bytes_the_server_sent(synth_tiny, tmp_path):
    """One count of downloaded bytes, judged by the server's log: a body cut and resumed by Range is
    counted once, a corrupted body that is fetched again twice; the last progress line shows the same."""
    files = sorted(image.filename for image in scene_files(synth_tiny) if image.downloadable and image.filename.endswith(".dng"))
    faults = Faults(drop_after={files[0]: (50_000, 1)}, corrupt={files[1]: 1})
    log = io.StringIO()
    with DataverseServer(str(synth_tiny), faults=faults) as server:
        report = run_fetch(FetchOptions(dest=str(tmp_path / "d"), dataverse=server.url, doi=SYNTH_DOI, metadata=False,
                                        backoff=0.01, progress="log", log_interval=60, stream=log))
        assert server.wait_idle(EVENT)
    scene_names = {image.filename for image in scene_files(synth_tiny)}
    sent = sum(entry.get("bytes", 0) for entry in server.log if entry.get("file") in scene_names)
    served_twice = sum(entry.get("file") == files[1] for entry in server.log)
    assert report["failed"] == [] and served_twice == 2 and report["retries"] == 2
    assert report["bytes_downloaded"] == sent
    [done] = [line for line in log.getvalue().splitlines() if " done: " in line]
    assert f"| {human_bytes(sent)}/" in done, done


def test_the_fetcher_has_one_import_path_and_fetch_stays_callable():
    """`wdsprep.rawnind.fetch` is the function; the deprecated module of the same name (a callable
    module standing in for it) is gone, so no import can rebind the name to a module."""
    code = ("import importlib.util, wdsprep\n"
            "from wdsprep.rawnind import fetch, FetchOptions\n"
            "from wdsprep.sources.rawnind.acquire.fetch import FetchOptions as defined\n"
            "assert importlib.util.find_spec('wdsprep.sources.rawnind.fetch') is None\n"
            "assert callable(fetch) and FetchOptions is defined\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=EVENT)
    assert result.returncode == 0, result.stderr
