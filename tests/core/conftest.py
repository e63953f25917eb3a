import pytest

from .shardsets import write_counted_shards  # noqa: F401 (used by the fixtures below; tests may import it too)


@pytest.fixture(scope="session")
def counted_shards(tmp_path_factory):
    """`counted_shards(counts, codec=..., tag=..., pack_rows=...)` -> manifest path, written once per distinct argument set
    (session-scoped so that hypothesis examples can share it)."""
    made: dict = {}

    def make(counts, *, codec="none", tag="", pack_rows=None):
        wanted = (tuple(counts), codec, tag, pack_rows)
        if wanted not in made:
            made[wanted] = write_counted_shards(tmp_path_factory.mktemp("counted"), list(counts), codec=codec, tag=tag,
                                                pack_rows=pack_rows)
        return made[wanted]

    return make


@pytest.fixture
def uneven_manifest(tmp_path):
    """The issue's case: 8 shards of 7,7,7,7,7,7,7,1 samples."""
    return write_counted_shards(tmp_path / "uneven", [7, 7, 7, 7, 7, 7, 7, 1])


@pytest.fixture(scope="session")
def generic_input(tmp_path_factory):
    from wdsprep.sources.generic import SOURCE

    root = tmp_path_factory.mktemp("generic") / "in"
    SOURCE.synth(str(root), 0, "small")
    return str(root)
