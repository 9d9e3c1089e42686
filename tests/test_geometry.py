"""The kernel's geometry: boxes against a voxel-by-voxel model, mags against webKnossos' names."""

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway_storage.geometry import Box, Vec3, canonical_mag_name, long_mag_name, mag_name, mag_names, parse_mag

coordinate = st.integers(min_value=-20, max_value=20)
extent = st.integers(min_value=0, max_value=12)
vectors = st.tuples(coordinate, coordinate, coordinate)
sizes = st.tuples(extent, extent, extent)
boxes = st.builds(Box.sized, vectors, sizes)
powers = st.sampled_from([1, 2, 4, 8, 16])
mags = st.tuples(powers, powers, powers)


def voxels(box: Box) -> set[Vec3]:
    """Every voxel of ``box``, one by one: the model the box's arithmetic is checked against."""
    xs, ys, zs = (range(low, h) for low, h in zip(box.lo, box.hi))
    return set(itertools.product(xs, ys, zs))


@given(boxes, boxes)
def test_clip_is_the_voxels_both_boxes_hold(a: Box, b: Box) -> None:
    clipped = a.clip(b)
    both = voxels(a) & voxels(b)
    if not both:
        assert clipped is None
    else:
        assert clipped is not None and voxels(clipped) == both


@given(boxes, boxes)
def test_contains_is_every_voxel_inside(a: Box, b: Box) -> None:
    if not b.is_empty:
        assert a.contains(b) == (voxels(b) <= voxels(a))


@given(vectors, sizes)
def test_a_sized_box_has_its_size(top_left: Vec3, size: Vec3) -> None:
    box = Box.sized(top_left, size)
    assert box.lo == top_left and box.size == size
    assert box.is_empty == (0 in size)
    assert len(voxels(box)) == size[0] * size[1] * size[2]


@given(st.tuples(extent, extent, extent), sizes, mags)
def test_at_mag_is_the_coarse_voxels_a_fine_box_touches(top_left: Vec3, size: Vec3, mag: Vec3) -> None:
    """The mag-m box of a mag-1 box is ``[floor(topLeft/m), ceil((topLeft+size)/m))``: every coarse voxel that
    holds a fine voxel of the box, and no other."""
    fine = Box.sized(top_left, size)
    coarse = fine.at_mag(mag)
    if fine.is_empty:
        return
    touched = {(x // mag[0], y // mag[1], z // mag[2]) for x, y, z in voxels(fine)}
    assert voxels(coarse) == touched


def test_at_mag_rounds_outward() -> None:
    assert Box.sized((37, 21, 5), (150, 120, 70)).at_mag((4, 4, 2)) == Box((9, 5, 2), (47, 36, 38))


@given(boxes, vectors)
def test_slices_of_a_shifted_box_select_its_voxels(box: Box, origin: Vec3) -> None:
    inside = Box.sized(origin, (30, 30, 30)).clip(box)
    if inside is None:
        return
    grid = np.zeros((30, 30, 30), dtype=bool)
    grid[inside.shifted(origin).slices()] = True
    assert {(x + origin[0], y + origin[1], z + origin[2]) for x, y, z in zip(*np.nonzero(grid))} == voxels(inside)


@pytest.mark.parametrize(
    ("mag", "name"), [((1, 1, 1), "1"), ((2, 2, 2), "2"), ((2, 2, 1), "2-2-1"), ((1, 2, 4), "1-2-4")]
)
def test_mags_are_named_as_webknossos_names_them(mag: Vec3, name: str) -> None:
    assert mag_name(mag) == name
    assert parse_mag(name) == mag
    assert canonical_mag_name(name) == name


@given(mags)
def test_every_name_of_a_mag_parses_back_to_it(mag: Vec3) -> None:
    assert mag_names(mag)[0] == mag_name(mag)
    assert long_mag_name(mag) in mag_names(mag)
    for name in mag_names(mag):
        assert parse_mag(name) == mag
        assert canonical_mag_name(name) == mag_name(mag)


def test_the_long_name_of_an_isotropic_mag_is_accepted() -> None:
    assert mag_names((2, 2, 2)) == ("2", "2-2-2")
    assert canonical_mag_name("2-2-2") == "2"
    assert mag_names((2, 2, 1)) == ("2-2-1",)


@pytest.mark.parametrize("value", [2, "2", [2, 2, 2], (2, 2, 2), "2-2-2"])
def test_a_mag_parses_from_every_form_a_properties_file_uses(value: object) -> None:
    assert parse_mag(value) == (2, 2, 2)


@pytest.mark.parametrize("value", ["", "2-2", "2-2-2-2", "x", "-1", "3", [2, 2], [2, 2, 3], 0, -2, True, [1.0, 1, 1]])
def test_what_is_no_mag_is_refused(value: object) -> None:
    with pytest.raises(ValueError):
        parse_mag(value)


@pytest.mark.parametrize("name", ["02", "2-2-02", "3-3-3", "c", "zarr.json", "2-1"])
def test_a_name_of_no_mag_is_left_as_it_is(name: str) -> None:
    assert canonical_mag_name(name) == name
