"""Several properties again, on one world of many simulated ranks.

The world comes from ``IDIST_PROPERTY_MANY`` (a runner spec as in ``IDIST_PROPERTY_RUNNER``;
default ``threads@64``, empty to skip): every rank count the suite runs elsewhere is small, and
a simulated world of 64 ranks costs no socket or descriptor. Each property runs with the
current profile's settings but ``MANY_EXAMPLES`` examples, since every example is one run of
64 ranks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
from hypothesis import settings

from idist.testing import Runner, runners_from_env

from . import test_all_gather, test_all_reduce, test_barrier, test_broadcast, test_groups, test_numbers

MANY_EXAMPLES = 4
#: where hypothesis keeps a test's settings (no public way to run a test with other settings)
_SETTINGS = "_hypothesis_internal_use_settings"
SPEC = os.environ.get("IDIST_PROPERTY_MANY", "threads@64")
PROPERTIES: list[Callable[..., None]] = [
    test_all_reduce.test_tensor_all_reduce_is_the_reference_fold_in_place,
    test_all_reduce.test_ranks_agree_bit_for_bit,
    test_numbers.test_ints_are_exact_in_int64,
    test_numbers.test_floats_are_the_exact_left_fold,
    test_all_gather.test_values_round_trip_exactly_in_rank_order,
    test_all_gather.test_tensors_of_any_shape_round_trip_bit_for_bit,
    test_broadcast.test_python_values_from_any_src_exactly,
    test_groups.test_random_subsets_behave_as_their_own_world,
    test_barrier.test_no_rank_leaves_before_all_arrived,
]


@pytest.fixture(scope="module")
def many() -> Iterator[Runner]:
    specs = runners_from_env({"IDIST_PROPERTY_RUNNER": SPEC}) if SPEC.strip() else []
    if not specs:
        pytest.skip("IDIST_PROPERTY_MANY is empty")
    world = specs[0].build()
    try:
        yield world
    finally:
        world.close()


@pytest.mark.parametrize("prop", PROPERTIES, ids=lambda p: f"{p.__module__.rsplit('.', 1)[-1]}::{p.__name__}")
def test_holds_on_many_ranks(many: Runner, prop: Callable[..., None]) -> None:
    # @given fixed the profile's settings on the test when its module was imported
    saved: settings = getattr(prop, _SETTINGS)
    setattr(prop, _SETTINGS, settings(saved, max_examples=MANY_EXAMPLES))
    try:
        prop(runner=many)
    finally:
        setattr(prop, _SETTINGS, saved)
