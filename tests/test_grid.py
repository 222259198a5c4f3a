from tula import config
from tula.grid import Point, batch_sizes, grid, search_set


def test_batches_are_powers_of_two_between_bounds():
    cfg = config.from_dict({"grid": {"batch_min": 32, "batch_max": 256}})
    assert batch_sizes(cfg) == [32, 64, 128, 256]


def test_full_search_is_the_whole_grid():
    cfg = config.from_dict({"grid": {"nodes": [1, 2, 4], "batch_min": 32, "batch_max": 128}, "search": "full"})
    pts = search_set(cfg)
    assert pts == grid(cfg) and len(pts) == 9
    assert all(p.global_batch % p.nodes == 0 for p in pts)


def test_partial_search_is_the_four_corners():
    cfg = config.from_dict({"grid": {"nodes": [4, 1, 2], "batch_min": 32, "batch_max": 512}, "search": "partial"})
    assert search_set(cfg) == [Point(1, 32), Point(1, 512), Point(4, 32), Point(4, 512)]


def test_partial_with_one_n_and_one_b_is_one_point():
    cfg = config.from_dict({"grid": {"nodes": [2], "batch_min": 64, "batch_max": 64}})
    assert search_set(cfg) == [Point(2, 64)]


def test_point_names_and_local_batch():
    p = Point(4, 256)
    assert p.name == "N4_B256" and p.local_batch == 64
