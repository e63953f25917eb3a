"""DeepReg's pair-index generators, restated over `random.Random` with DeepReg's draw order.

Given the same integer seed and the same data, these produce exactly the index sequences of
DeepReg's `sample_index_generator` (paired, unpaired, grouped sampled and iterated), which is what
lets `pairs()` reproduce DeepReg's epochs bit for bit on a single-shard split.
"""
from __future__ import annotations

import random
from typing import Iterator, Sequence

from ...errors import DeepRegSamplingError

INTRA_OPTIONS = ("forward", "backward", "unconstrained")


def check_grouped_options(num_groups: int | None, intra_group_prob: float, intra_group_option: str,
                          sample_image_in_group: bool) -> None:
    if not 0 <= intra_group_prob <= 1:
        raise DeepRegSamplingError(f"intra_group_prob must be between 0 and 1, got {intra_group_prob}")
    if intra_group_option not in INTRA_OPTIONS:
        raise DeepRegSamplingError(
            f"Unknown intra_group_option, must be forward/backward/unconstrained, got {intra_group_option}")
    if not sample_image_in_group and intra_group_prob not in (0, 1):
        raise DeepRegSamplingError("Mixing intra and inter groups is not supported when not sampling pairs.")
    if num_groups is not None and intra_group_prob < 1 and num_groups < 2:
        raise DeepRegSamplingError(
            f"There are {num_groups} groups, we need at least two groups for inter group sampling")


def paired_order(num_pairs: int, rnd: random.Random) -> list[int]:
    order = list(range(num_pairs))
    rnd.shuffle(order)
    return order


def unpaired_order(num_images: int, rnd: random.Random) -> list[tuple[int, int]]:
    order = list(range(num_images))
    rnd.shuffle(order)
    return [(order[2 * s], order[2 * s + 1]) for s in range(num_images // 2)]


def grouped_sampled(group_sizes: Sequence[int], rnd: random.Random, intra_group_prob: float,
                    intra_group_option: str) -> Iterator[tuple[int, int, int, int]]:
    """One pair per group in shuffled group order (groups with < 2 images skip intra draws)."""
    num_groups = len(group_sizes)
    group_indices = list(range(num_groups))
    rnd.shuffle(group_indices)
    for group in group_indices:
        if rnd.random() <= intra_group_prob:
            if group_sizes[group] < 2:
                continue
            first, second = rnd.sample(list(range(group_sizes[group])), 2)
            if intra_group_option == "forward":
                first, second = min(first, second), max(first, second)
            elif intra_group_option == "backward":
                first, second = max(first, second), min(first, second)
            yield group, first, group, second
        else:
            other = rnd.choice([g for g in range(num_groups) if g != group])
            first = rnd.choice(list(range(group_sizes[group])))
            second = rnd.choice(list(range(group_sizes[other])))
            yield group, first, other, second


def grouped_enumerated(group_sizes: Sequence[int], intra_group_prob: float,
                       intra_group_option: str) -> list[tuple[int, int, int, int]]:
    """Every pair, in DeepReg's enumeration order (before the per-epoch shuffle)."""
    result = []
    if intra_group_prob == 1:
        for group, size in enumerate(group_sizes):
            for i in range(size):
                for j in range(i):
                    if intra_group_option in ("forward", "unconstrained"):
                        result.append((group, j, group, i))
                    if intra_group_option in ("backward", "unconstrained"):
                        result.append((group, i, group, j))
    else:
        for first_group, first_size in enumerate(group_sizes):
            for second_group, second_size in enumerate(group_sizes):
                if first_group == second_group:
                    continue
                for a in range(first_size):
                    for b in range(second_size):
                        result.append((first_group, a, second_group, b))
    return result


def grouped_iterated(group_sizes: Sequence[int], rnd: random.Random, intra_group_prob: float,
                     intra_group_option: str) -> list[tuple[int, int, int, int]]:
    indices = grouped_enumerated(group_sizes, intra_group_prob, intra_group_option)
    rnd.shuffle(indices)
    return indices
