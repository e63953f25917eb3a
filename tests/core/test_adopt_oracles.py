"""The plan, resume and loader oracles (tests/core/test_plan_oracle.py, test_loader_oracle.py), run on
adopted shards: the same tests (imported, not copied), with `counted_shards` here writing each shard
set with webdataset's own `TarWriter` (PAX headers before every member, end blocks padded to tar's
10 KiB record) and adopting it with `wdsprep index`, so every rank (1-8 ranks), worker (0-4), resume,
resume of a resumed run and elastic resume on an adopted dataset is checked against the reference
model, over the keys the test wrote."""
import pytest

from tests.core import test_loader_oracle as loader_oracle
from tests.core import test_plan_oracle as oracle
from wdsprep.adopt import adopt

from .adoptdata import counted_webdataset_shards


@pytest.fixture(scope="module")
def counted_shards(tmp_path_factory):
    """`counted_shards(counts, codec=..., tag=...)` -> the manifest of such shards, webdataset-written, adopted."""
    made: dict = {}

    def make(counts, *, codec="none", tag=""):
        wanted = (tuple(counts), tag)
        if wanted not in made:
            root = tmp_path_factory.mktemp("adopted")
            shards = counted_webdataset_shards(root / "shards", list(counts), tag=tag)
            adopt([str(shards)], str(root / "out"), workers=1)
            made[wanted] = str(root / "out" / "manifest.json")
        return made[wanted]

    return make


test_every_rank_and_worker_reads_what_the_model_says_adopted = oracle.test_every_rank_and_worker_reads_what_the_model_says
test_rank_counts_and_padding_content_follow_from_the_input_alone_adopted = oracle.test_rank_counts_and_padding_content_follow_from_the_input_alone
test_resume_and_resume_of_a_resumed_run_give_exactly_the_rest_adopted = oracle.test_resume_and_resume_of_a_resumed_run_give_exactly_the_rest
test_a_state_saved_before_a_resumed_run_delivers_is_the_loaded_one_adopted = oracle.test_a_state_saved_before_a_resumed_run_delivers_is_the_loaded_one
test_elastic_resume_delivers_the_rest_exactly_once_adopted = oracle.test_elastic_resume_delivers_the_rest_exactly_once
test_elastic_resume_after_a_padding_repeat_shuffled_before_its_sample_adopted = oracle.test_elastic_resume_after_a_padding_repeat_shuffled_before_its_sample
test_a_state_from_another_dataset_with_as_many_shards_is_refused_adopted = oracle.test_a_state_from_another_dataset_with_as_many_shards_is_refused
test_loader_delivers_the_model_and_resumes_from_every_batch_adopted = loader_oracle.test_loader_delivers_the_model_and_resumes_from_every_batch
test_a_rank_with_padding_resumes_with_its_workers_in_order_adopted = loader_oracle.test_a_rank_with_padding_resumes_with_its_workers_in_order
