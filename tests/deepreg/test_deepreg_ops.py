"""Normalisation, resize and DeepReg's index generators, without any data files."""
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.ndimage import zoom

from wdsprep.sources.deepreg import (
    grouped_enumerated,
    grouped_iterated,
    grouped_sampled,
    normalize,
    pairs,
    paired_order,
    resize,
    unpaired_order,
)
from wdsprep.errors import ConfigError, DeepRegSamplingError


def test_normalize_matches_deepreg_unit_tests():
    np.testing.assert_allclose(normalize(np.array([0, 1, 2])), [0, 0.5, 1])
    np.testing.assert_allclose(normalize(np.array([-2, 0, 1, 2])), [0, 0.5, 0.75, 1])
    np.testing.assert_array_equal(normalize(np.array([1, 1, 1, 1])), [0, 0, 0, 0])
    assert normalize(np.array([3, 5], dtype=np.uint8)).dtype == np.float32


def scipy_reference(volume, shape):
    return zoom(volume.astype(np.float64), [o / i for o, i in zip(shape, volume.shape)], order=1, grid_mode=True,
                mode="nearest")


@settings(max_examples=40, deadline=None)
@given(st.tuples(*[st.integers(1, 12)] * 3), st.tuples(*[st.integers(1, 12)] * 3), st.integers(0, 2**31))
def test_resize_equals_scipy_linear_zoom(shape_in, shape_out, seed):
    volume = np.random.default_rng(seed).random(shape_in, dtype=np.float32)
    ours = resize(volume, shape_out)
    assert ours.shape == shape_out
    np.testing.assert_allclose(ours, scipy_reference(volume, shape_out), atol=1e-5)


@pytest.mark.parametrize("shapes", [((64, 64, 60), (16, 16, 16)), ((44, 59, 41), (64, 64, 60)), ((5, 7, 9), (9, 7, 5))])
def test_resize_equals_torch_trilinear(shapes):
    shape_in, shape_out = shapes
    volume = np.random.default_rng(1).random(shape_in, dtype=np.float32)
    expected = torch.nn.functional.interpolate(torch.from_numpy(volume)[None, None], size=shape_out,
                                               mode="trilinear", align_corners=False)[0, 0].numpy()
    np.testing.assert_allclose(resize(volume, shape_out), expected, atol=1e-5)


def test_resize_keeps_a_matching_volume():
    volume = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert resize(volume, (2, 3, 4)) is volume
    assert resize(volume, None) is volume


def test_reference_orders_with_seed_0():
    assert paired_order(25, random.Random(0)) == [14, 0, 23, 18, 6, 5, 7, 10, 22, 20, 4, 2, 21, 3, 17, 11, 19, 9,
                                                  24, 15, 16, 8, 1, 13, 12]
    assert unpaired_order(14, random.Random(0)) == [(1, 10), (9, 5), (11, 2), (3, 7), (8, 4), (0, 12), (6, 13)]
    assert list(grouped_sampled([4, 3], random.Random(0), 1, "forward")) == [(0, 0, 0, 3), (1, 1, 1, 2)]
    assert unpaired_order(2, random.Random(0)) == [(0, 1)] and unpaired_order(2, random.Random(1)) == [(1, 0)]
    assert unpaired_order(1, random.Random(0)) == []


def test_enumeration_counts():
    for sizes, forward, unconstrained, inter in (([4, 3], 9, 18, 24), ([2], 1, 2, 0), ([4, 2, 3], 10, 20, 52)):
        assert len(grouped_enumerated(sizes, 1, "forward")) == forward
        assert len(grouped_enumerated(sizes, 1, "backward")) == forward
        assert len(set(grouped_enumerated(sizes, 1, "unconstrained"))) == unconstrained
        total = sum(sizes)
        assert len(set(grouped_enumerated(sizes, 0, "forward"))) == inter == total * (total - 1) - sum(
            n * (n - 1) for n in sizes)
    assert sorted(grouped_iterated([4, 3], random.Random(3), 1, "forward")) == sorted(
        grouped_enumerated([4, 3], 1, "forward"))


def test_mixed_sampling_draws_inter_pairs():
    draws = [list(grouped_sampled([3, 3, 2], random.Random(seed), 0.5, "unconstrained")) for seed in range(30)]
    flat = [d for epoch in draws for d in epoch]
    assert any(a == c for a, _, c, _ in flat) and any(a != c for a, _, c, _ in flat)
    assert all(len(epoch) == 3 for epoch in draws)
    # groups with one image are skipped for intra draws, as in DeepReg
    assert list(grouped_sampled([1, 1], random.Random(0), 1, "forward")) == []


def test_option_errors_have_deepreg_messages():
    with pytest.raises(DeepRegSamplingError, match="Mixing intra and inter groups is not supported"):
        pairs("grouped", intra_group_prob=0.5, sample_image_in_group=False)
    with pytest.raises(ValueError, match="Unknown intra_group_option, must be forward/backward/unconstrained"):
        pairs("grouped", intra_group_option="wrong")
    with pytest.raises(ConfigError, match="image_shape has to be length of three"):
        pairs("unpaired", image_shape=(1, 2))
    with pytest.raises(ConfigError, match="moving_image_shape and fixed_image_shape have length of three"):
        pairs("paired", moving_image_shape=(1, 2, 3, 4))
    with pytest.raises(ConfigError, match="Unknown label sampling policy"):
        pairs("paired", sample_label="some")
    with pytest.raises(ConfigError, match="must be one of"):
        pairs("tripled")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 100), min_size=1, max_size=30), st.integers(1, 300))
def test_unit_grouping_keeps_order_and_constraints(sizes, target):
    from wdsprep.sources.deepreg.convert import _at_least_two, _even_groups, group_by_size

    items = list(range(len(sizes)))
    even = _even_groups(items, sizes, target)
    assert [i for unit in even for i in unit] == items
    assert all(len(unit) % 2 == 0 for unit in even[:-1]) and all(even)
    paired_up = _at_least_two(group_by_size(items, sizes, target))
    assert [i for unit in paired_up for i in unit] == items
    if len(items) >= 2:
        assert all(len(unit) >= 2 for unit in paired_up)
