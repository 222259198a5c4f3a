from dataclasses import replace

import numpy as np
import pytest

from tula import config, model_inputs
from tula.model.grid import (
    Point,
    batch_sizes,
    batches_at,
    grid,
    micro_steps,
    search_set,
    sweep_local_batches,
)


def test_batches_are_powers_of_two_between_bounds():
    cfg = config.from_dict({"grid": {"batch_min": 32, "batch_max": 256}})
    assert batch_sizes(model_inputs.grid_spec(cfg)) == [32, 64, 128, 256]


def test_full_search_is_the_whole_grid():
    cfg = config.from_dict(
        {"grid": {"workers": [1, 2, 4], "batch_min": 32, "batch_max": 128}, "search": "full"}
    )
    pts = search_set(model_inputs.grid_spec(cfg))
    assert pts == grid(model_inputs.grid_spec(cfg)) and len(pts) == 9
    assert all(p.global_batch % p.workers == 0 for p in pts)


def test_partial_search_is_the_four_corners():
    cfg = config.from_dict(
        {"grid": {"workers": [4, 1, 2], "batch_min": 32, "batch_max": 512}, "search": "partial"}
    )
    assert search_set(model_inputs.grid_spec(cfg)) == [
        Point(1, 32),
        Point(1, 512),
        Point(4, 32),
        Point(4, 512),
    ]


def test_a_scripts_partial_search_probes_every_fitting_b_at_the_corner_ns(tmp_path):
    """A user's script cannot sweep the compute curve between its points (it runs the one
    batch it was started with): at the N's a partial search probes, every B that fits is a
    point; the N's between are still left to the model."""
    raw = {"grid": {"workers": [4, 1, 2], "batch_min": 32, "batch_max": 256}}
    (tmp_path / "train.py").write_text("")
    own = {"script": str(tmp_path / "train.py")}
    script = config.from_dict({**raw, "workload": own})
    g = model_inputs.grid_spec(script)
    assert not g.swept and model_inputs.grid_spec(config.from_dict(raw)).swept
    assert search_set(g, max_local_batch=32) == [
        Point(1, 32),
        *(Point(4, b) for b in (32, 64, 128)),
    ]
    assert [p for p in search_set(g) if p.workers == 2] == []
    full = config.from_dict({**raw, "workload": own, "search": "full"})
    assert search_set(model_inputs.grid_spec(full)) == grid(g)


def test_partial_with_one_n_and_one_b_is_one_point():
    cfg = config.from_dict({"grid": {"workers": [2], "batch_min": 64, "batch_max": 64}})
    assert search_set(model_inputs.grid_spec(cfg)) == [Point(2, 64)]


def test_point_names_and_local_batch():
    p = Point(4, 256)
    assert p.name == "N4_B256" and p.local_batch == 64


def test_partial_search_never_probes_beyond_b_max():
    # b_max = 64 per worker: N=1 fits B <= 64, N=4 fits B <= 256 (paper §III-A.2: b_max first)
    raw = {"grid": {"workers": [1, 2, 4], "batch_min": 32, "batch_max": 512}, "search": "partial"}
    cfg = config.from_dict({**raw, "train": {"accumulate": 1}})
    pts = search_set(model_inputs.grid_spec(cfg), max_local_batch=64)
    assert pts == [Point(1, 32), Point(1, 64), Point(4, 32), Point(4, 256)]
    assert all(p.local_batch <= 64 for p in pts)
    # accumulate: auto (the default) reaches past b_max as micro-batches; the partial search
    # keeps its single-batch corners and adds the largest accumulated point, N = 4, B = 512
    auto = model_inputs.grid_spec(config.from_dict(raw))
    assert search_set(auto, max_local_batch=64) == [*pts, Point(4, 512)]
    assert search_set(replace(auto, search="full"), max_local_batch=64) == grid(auto)


def test_micro_steps_are_the_fewest_that_fit_or_the_fixed_k():
    assert micro_steps(64, "auto", 64) == 1 and micro_steps(65, "auto", 64) == 2
    assert micro_steps(512, "auto", 64) == 8 and micro_steps(512, "auto", None) == 1
    assert micro_steps(512, 4, 64) == 4 and micro_steps(32, 2, None) == 2
    assert micro_steps(np.array([32, 128, 96]), "auto", 64).tolist() == [1, 2, 2]


def test_full_search_drops_what_does_not_fit_and_a_node_count_where_nothing_fits():
    one = {"accumulate": 1}  # one batch a step: no micro-batches past b_max
    cfg = config.from_dict(
        {
            "grid": {"workers": [1, 4], "batch_min": 64, "batch_max": 256},
            "search": "full",
            "train": one,
        }
    )
    assert search_set(model_inputs.grid_spec(cfg), max_local_batch=32) == [
        Point(4, 64),
        Point(4, 128),
    ]
    partial = config.from_dict(
        {"grid": {"workers": [1, 4], "batch_min": 64, "batch_max": 256}, "train": one}
    )
    assert search_set(model_inputs.grid_spec(partial), max_local_batch=32) == [
        Point(4, 64),
        Point(4, 128),
    ]  # N=1 has no point that fits


def test_sweep_takes_the_grids_other_local_batches_that_fit_and_the_job_does_not_probe():
    cfg = config.from_dict({"grid": {"workers": [1, 2, 4], "batch_min": 32, "batch_max": 256}})
    # local batches of the grid: 8 ... 256; this job runs b=64 at N=2
    assert sweep_local_batches(model_inputs.grid_spec(cfg), 2, 64, None) == [8, 16, 32, 128, 256]
    assert sweep_local_batches(model_inputs.grid_spec(cfg), 2, 64, 128) == [8, 16, 32, 128]  # b_max
    assert sweep_local_batches(model_inputs.grid_spec(cfg), 2, 64, None, train_samples=300) == [
        8,
        16,
        32,
        128,
    ]  # 2 x 256 > 300
    # a global batch of exactly one epoch still fits in it
    assert sweep_local_batches(model_inputs.grid_spec(cfg), 2, 64, None, train_samples=256) == [
        8,
        16,
        32,
        128,
    ]
    # the local batches the job probes anyway are left to their points' own compute-only arms
    assert sweep_local_batches(model_inputs.grid_spec(cfg), 2, 64, None, probed=[8, 64, 128]) == [
        16,
        32,
        256,
    ]


def test_an_oom_corner_falls_back_to_the_next_smaller_batches_above_the_small_corner():
    from tula.stages.probe import fallback_batches

    cfg = config.from_dict({"grid": {"workers": [1, 2], "batch_min": 32, "batch_max": 256}})
    assert fallback_batches(cfg, Point(2, 256), None) == [128, 64]
    assert fallback_batches(cfg, Point(2, 32), None) == []  # the small corner has nothing below it
    full = config.from_dict(
        {"grid": {"workers": [1, 2], "batch_min": 32, "batch_max": 256}, "search": "full"}
    )
    assert fallback_batches(full, Point(2, 256), None) == []  # full search probes them anyway


def test_partial_search_probes_both_sides_of_a_node_boundary():
    """8 workers per node, N in {1, 2, 4, 8, 16, 32}: the corners (N = 1 and 32) and, at the
    smallest and largest B, the largest one-node N (8) and the smallest two-node N (16); one
    worker per node (the paper's) has no boundary to add."""
    from tula import config
    from tula.model.grid import boundary_workers, search_set

    cfg = config.from_dict(
        {
            "grid": {"workers": [1, 2, 4, 8, 16, 32], "batch_min": 32, "batch_max": 1024},
            "cluster": {"workers_per_node": 8},
            "train": {"accumulate": 1},  # one batch a step: the corners alone
        }
    )
    assert boundary_workers(model_inputs.grid_spec(cfg)) == (8, 16)
    assert [p.name for p in search_set(model_inputs.grid_spec(cfg))] == [
        "N1_B32",
        "N1_B1024",
        "N8_B32",
        "N8_B1024",
        "N16_B32",
        "N16_B1024",
        "N32_B32",
        "N32_B1024",
    ]
    assert [p.name for p in search_set(model_inputs.grid_spec(cfg), max_local_batch=64)] == [
        "N1_B32",
        "N1_B64",
        "N8_B32",
        "N8_B512",
        "N16_B32",
        "N16_B1024",
        "N32_B32",
        "N32_B1024",
    ]
    paper = config.from_dict(
        {"grid": {"workers": [1, 2, 4, 8, 16], "batch_min": 32, "batch_max": 1024}}
    )
    assert (
        boundary_workers(model_inputs.grid_spec(paper)) == ()
        and len(search_set(model_inputs.grid_spec(paper))) == 4
    )


def test_the_mean_step_training_pays_weighs_its_kinds():
    """An epoch of 1,437 samples at B = 512 on 2 workers: 3 steps, its first and its short last
    batch a third each; AGS's mid-epoch refresh at its own share; an epoch of one step has no
    plain step for the mix."""
    from tula.model.grid import paid_mix

    assert paid_mix(1437, 512, 2, 0.0) == pytest.approx({"start": 1 / 3, "partial": 1 / 3})
    with_refresh = paid_mix(1437, 512, 2, 0.05)
    assert with_refresh == pytest.approx({"start": 1 / 3, "partial": 1 / 3, "refresh": 0.05})
    assert paid_mix(1024, 256, 1, 0.0) == pytest.approx({"start": 1 / 4})  # no short batch
    assert paid_mix(512, 512, 1, 0.0) is None


def test_the_batches_at_an_n_are_that_ns_points_only():
    cfg = config.from_dict(
        {"grid": {"workers": [1, 2, 4], "batch_min": 32, "batch_max": 512}, "search": "partial"}
    )
    g = model_inputs.grid_spec(cfg)
    assert batches_at(g, 4) == [32, 512] and batches_at(g, 2) == []
    assert batches_at(g, 1) == sorted(p.global_batch for p in search_set(g) if p.workers == 1)


def test_an_epochs_steps_are_an_int_for_one_batch_and_an_array_for_many():
    from tula.model.grid import steps_per_epoch

    one = steps_per_epoch(100, 32, 2)  # 3 full batches and a tail of 4, kept
    assert one == 4 and type(one) is int
    assert steps_per_epoch(100, np.array([32, 50]), 2).tolist() == [4, 2]


def test_a_tail_of_one_sample_is_a_step_on_one_worker_and_none_on_two():
    from tula.model.grid import short_last_batch, steps_per_epoch

    assert short_last_batch(33, 32, 1) and steps_per_epoch(33, 32, 1) == 2
    assert not short_last_batch(33, 32, 2) and steps_per_epoch(33, 32, 2) == 1


def test_where_no_batch_fits_each_sample_is_its_own_micro_batch():
    """b_max 0 (not one sample fits the budget, as far as the memory model knows): accumulate
    auto splits each local batch into single samples, the smallest step there is."""
    from tula.model.grid import micro_steps

    assert micro_steps(np.array([8, 32]), "auto", max_local_batch=0).tolist() == [8, 32]
