"""The core uses stores only through `wdsprep.storage.Store`: no `hasattr`/`getattr`/`isinstance`
probing of a store in `conversion.py`, `upload.py`, `cli.py`, `stream/*`, or any module outside
`storage/` (read from their syntax trees). Every method the core calls exists on the base class,
with a documented default where a store may lack the capability; the capability flags say which."""
from __future__ import annotations

import ast
import inspect
import pathlib

import pytest

from wdsprep import storage
from wdsprep.storage import base, local, s3

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "src" / "wdsprep"
# the core (conversion.py, upload.py, cli.py, stream/*) and every other module outside storage/ itself
CORE = sorted(path for path in PACKAGE.rglob("*.py") if path.relative_to(PACKAGE).parts[0] != "storage")
PROBES = ("hasattr", "getattr", "isinstance")


def _store_words() -> set[str]:
    """Names that only make sense on a store: its classes, and every attribute of a store class that
    is not a plain object's (method names, capability flags, `directory`, `bucket`...)."""
    classes = [base.Store, local.LocalStore, s3.S3Store]
    words = {cls.__name__ for cls in classes}
    for cls in classes:
        words |= {name for name in dir(cls) if not name.startswith("__")}
    words |= {"directory", "bucket", "prefix"}  # instance attributes of the concrete stores
    return words - {"url"}  # a URL is also a manifest's, a stream's...


def _is_store(node: ast.AST) -> bool:
    """`store`, `self.store`, `output_store`...: what the core calls its stores."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lower() == "store" or name.lower().endswith("_store")


def _mentions_store(node: ast.AST) -> bool:
    return any(_is_store(n) for n in ast.walk(node))


def store_probes(source: str, filename: str = "<source>") -> list[str]:
    """`file:line: call` for every hasattr/getattr/isinstance that looks at a store."""
    words = _store_words()
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PROBES and node.args):
            continue
        subject, rest = node.args[0], node.args[1:2]  # a getattr default is not what is probed
        names = {n.id for arg in rest for n in ast.walk(arg) if isinstance(n, ast.Name)}
        strings = {n.value for arg in rest for n in ast.walk(arg) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        if _mentions_store(subject) or (names | strings) & words:
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_core_never_probes_a_store():
    named = {str(path.relative_to(PACKAGE)) for path in CORE}
    assert {"conversion.py", "upload.py", "cli.py", "stream/reading/read.py", "stream/dataset.py"} <= named
    probes = [probe for path in CORE for probe in store_probes(path.read_text(), str(path.relative_to(PACKAGE)))]
    assert probes == []


@pytest.mark.parametrize("code", [
    'lock = store.lock() if hasattr(store, "lock") else None',
    'append = getattr(self.store, "append_bytes", None)',
    "local = isinstance(destination, LocalStore)",
    'directory = getattr(target, "directory", None)',
])
def test_the_checker_sees_the_probes_the_core_used_to_make(code):
    assert len(store_probes(code)) == 1


@pytest.mark.parametrize("code", [
    'shard_bytes = 1 if getattr(source, "whole_units", False) else 2',
    "if isinstance(result, BaseException): pass",
    'quiet = getattr(args, "quiet", False)',
])
def test_the_checker_leaves_other_probes_alone(code):
    assert store_probes(code) == []


def test_every_store_method_the_core_calls_is_declared_on_the_base_class():
    called = set()
    users = [path for path in CORE if "open_store(" in path.read_text()]  # where the core gets its stores
    assert {"conversion.py", "upload.py"} <= {path.name for path in users}
    for path in users:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and _is_store(node.value):
                called.add(node.attr)
    called -= {"url"}
    assert {"lock", "publish", "stat", "sha256", "content_sha256", "upload_file", "clean_temporaries"} <= called
    assert called <= set(dir(storage.Store)), called - set(dir(storage.Store))


def test_capabilities_are_declared_and_the_defaults_are_safe(tmp_path):
    bare = storage.Store("bare://x")
    assert (bare.supports_lock, bare.supports_append, bare.supports_listing) == (False, False, False)
    with bare.lock() as lock:  # a lock that excludes nothing
        lock.release()
    bare.clean_temporaries()
    with pytest.raises(NotImplementedError, match="supports_append"):
        bare.append_bytes("x", b"")
    with pytest.raises(NotImplementedError, match="supports_listing"):
        bare.list_names()
    store = storage.open_store(str(tmp_path / "out"))
    assert (store.supports_lock, store.supports_append, store.supports_listing) == (True, True, True)
    for cls in (local.LocalStore, s3.S3Store):
        overridden = {name for name, value in vars(cls).items() if inspect.isfunction(value)}
        assert (cls.supports_append and "append_bytes" in overridden) or (not cls.supports_append and "append_bytes" not in overridden)
        assert (cls.supports_listing and "list_names" in overridden) or (not cls.supports_listing and "list_names" not in overridden)
        assert (cls.supports_lock and "lock" in overridden) or (not cls.supports_lock and "lock" not in overridden)
