"""The grid as the model alone sees it (tula.model.estimated): b_max, the points ruled out,
the roofline, the campaign's price, and the estimate checked against the memory probe."""

import pytest

from tula import config, model_inputs
from tula.gpus import GPU, lookup
from tula.model import estimated

MIB = 2**20
# 1 GiB fixed, 100 MiB a sample, 10 GFLOP a sample
EST = {"fixed_bytes": 1024 * MIB, "per_sample_bytes": 100 * MIB, "flops_per_sample": 1e10}
FIGS = {"memory_gb": 10, "bandwidth_gbs": 1000, "fp32_tflops": 10, "bf16_tflops": 100}


def _cfg(**hardware):
    return config.from_dict(
        {
            "grid": {"workers": [1, 2], "batch_min": 32, "batch_max": 256},
            "hardware": {"gpu": FIGS, "memory_margin": 0.1, **hardware},
            "train": {"precision": "bf16"},
            "pricing": {"model": "worker_hour", "per_worker_hour": 2.0},
        }
    )


def _campaign(cfg):
    return model_inputs.device(cfg), model_inputs.probe_steps(cfg), model_inputs.price(cfg)


def test_b_max_and_the_points_ruled_out_with_a_clear_margin():
    """Budget 9 GB: b_max = (9e9 - 1 GiB) / 100 MiB = 75. A point is ruled out only where its
    estimate exceeds the budget by more than 25 % (b > 97): B=128 and 256 at N=1, B=256 (b=128)
    at N=2; b=64 fits, and a local batch between b_max and the margin is left to the probe."""
    cfg = _cfg()
    budget = cfg.hardware.memory_budget_bytes
    assert budget == 9e9
    assert estimated.max_local_batch(EST, budget) == int((9e9 - 1024 * MIB) // (100 * MIB)) == 75
    assert estimated.clear_bound(EST, budget) == int((9e9 * 1.25 - 1024 * MIB) // (100 * MIB)) == 97
    rows = estimated.grid_estimate(
        model_inputs.device(cfg), EST, [(1, 64), (1, 128), (1, 256), (2, 128), (2, 256)]
    )
    assert [(r["workers"], r["global_batch"]) for r in rows if r["ruled_out"]] == [
        (1, 128),
        (1, 256),
        (2, 256),
    ]
    assert [r["fits"] for r in rows] == [True, False, False, True, False]


def test_the_roofline_is_the_slower_of_flops_at_peak_and_bytes_at_full_bandwidth():
    gpu = GPU("mine", **FIGS)
    # b=64 in bf16: 6.4e11 FLOP / 1e14 = 6.4 ms; (1 GiB + 6400 MiB) / 1e12 B/s = 7.8 ms
    assert estimated.roofline_s(EST, 64, gpu, "bf16") == pytest.approx((1024 + 6400) * MIB / 1e12)
    # fp32 without TF32 figures: 6.4e11 / 1e13 = 64 ms, compute-bound
    assert estimated.roofline_s(EST, 64, gpu, "fp32") == pytest.approx(0.064)
    h100 = lookup("H100-SXM")
    assert h100.peak_flops("fp32") == 494.7e12  # TF32 tensor cores, as convolutions run


def test_the_campaign_price_lies_between_the_roofline_and_the_time_limits():
    cfg = _cfg()
    jobs = [{"workers": 1, "local_batch": 32}, {"workers": 2, "local_batch": 64}]
    price = estimated.campaign_price(*_campaign(cfg), EST, jobs)
    steps = cfg.probe.warmup_steps + cfg.probe.timed_steps
    gpu = GPU("mine", **FIGS)
    low = sum(
        2.0 * j["workers"] * steps * estimated.roofline_s(EST, j["local_batch"], gpu, "bf16") / 3600
        for j in jobs
    )
    high = 2.0 * (1 + 2) * (cfg.probe.timeout_s + 300) / 3600
    assert price["low"] == pytest.approx(low) and price["high"] == pytest.approx(high)
    # a second job at the same N starts on an allocation already up: no start-up time again
    again = estimated.campaign_price(*_campaign(cfg), EST, [*jobs, jobs[1]])
    assert again["high"] == pytest.approx(high + 2.0 * 2 * cfg.probe.timeout_s / 3600)
    assert (
        estimated.campaign_price(*_campaign(config.from_dict({})), EST, jobs) is None
    )  # no GPU named


def test_the_probe_wins_where_the_estimate_is_off_at_the_largest_batch():
    """The error that decides is the one nearest b_max; a large share of a small batch's few
    MiB is said but decides nothing."""
    fit = {"intercept": 1024 * MIB, "slope": 100 * MIB}
    measured = [
        {"local_batch": 2, "status": "ok", "peak_mem_bytes": 2 * (1224 * MIB)},  # est -50 %
        {"local_batch": 64, "status": "ok", "peak_mem_bytes": (1024 + 6400) * MIB},
        {"local_batch": 128, "status": "oom"},
    ]
    check = estimated.against_probe(EST, measured, fit)
    assert [r["local_batch"] for r in check["points"]] == [2, 64]
    assert check["points"][0]["error"] == pytest.approx(-0.5)
    assert check["error_at_largest"] == pytest.approx(0.0) and not check["disagrees"]
    assert check["worst_error"] == pytest.approx(0.5)
    measured[1]["peak_mem_bytes"] = (1024 + 6400) * MIB / 0.8  # the estimate 20 % low
    check = estimated.against_probe(EST, measured, fit)
    assert check["error_at_largest"] == pytest.approx(-0.2) and check["disagrees"]
    # the two terms against the probe's fit: the estimate's per sample and fixed bytes, each
    # over the fit's, less one; none where the fit has no such term
    off = estimated.against_probe(EST, measured, {"intercept": 512 * MIB, "slope": 125 * MIB})
    assert off["per_sample_error"] == pytest.approx(-0.2) and off["fixed_error"] == pytest.approx(1)
    assert estimated.against_probe(EST, measured, {"intercept": 0.0})["fixed_error"] is None


def test_memory_that_does_not_grow_with_the_batch_bounds_it_at_zero_or_not_at_all():
    """No memory a sample: every local batch fits the budget, or none does (b_max 0)."""
    from tula.model.estimated import max_local_batch

    est = {"per_sample_bytes": 0.0, "fixed_bytes": 10.0}
    assert max_local_batch(est, 20.0) is None and max_local_batch(est, 5.0) == 0


def test_a_batch_estimated_at_the_margin_exactly_is_not_clearly_out():
    """Clearly out is beyond the budget by more than CLEAR_MARGIN: 125 bytes against a budget
    of 100 is at the margin, not beyond it; a byte more is beyond."""
    at = {"fixed_bytes": 125.0, "per_sample_bytes": 0.0}
    assert 100 * (1 + estimated.CLEAR_MARGIN) == 125.0
    assert not estimated.clearly_out(at, 100.0, 1)
    assert estimated.clearly_out({**at, "fixed_bytes": 126.0}, 100.0, 1)
