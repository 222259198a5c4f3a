"""The gradient noise scale estimator (tula.model.noise): a known answer from linear regression."""

import numpy as np
import pytest

import bounds
from tula.model import noise


def regression_gradients(rng, w, w_star, sigma, n):
    """Per-sample gradients of the squared error 0.5 (x.w - y)^2 with x ~ N(0, I_d) and
    y = x.w* + N(0, sigma^2): g_i = x_i (x_i.(w - w*) - eps_i)."""
    x = rng.standard_normal((n, w.size))
    r = x @ (w - w_star) - sigma * rng.standard_normal(n)
    return x * r[:, None]


def test_noise_scale_of_linear_regression_with_known_noise_covariance():
    """For this model E[g] = delta = w - w* and (Isserlis) Sigma = (|delta|^2 + sigma^2) I + delta
    delta^T, so |G|^2 = |delta|^2 and tr(Sigma) = d (|delta|^2 + sigma^2) + |delta|^2: the
    estimator, fed what 4 data-parallel workers at b = 16 and their all-reduced B = 64 would see,
    recovers both."""
    rng = np.random.default_rng(0)
    d, sigma, workers, b = 20, 1.5, 4, 16
    w_star = rng.standard_normal(d)
    w = w_star + 0.3 * rng.standard_normal(d)
    delta2 = float(((w - w_star) ** 2).sum())
    true_trace = d * (delta2 + sigma**2) + delta2
    small, big = [], []
    for _ in range(4000):  # steps
        per_worker = [
            regression_gradients(rng, w, w_star, sigma, b).mean(0) for _ in range(workers)
        ]
        small.append(np.mean([(g**2).sum() for g in per_worker]))  # |G_b|^2, the workers' mean
        big.append((np.mean(per_worker, axis=0) ** 2).sum())  # |G_B|^2 of the all-reduced gradient
    est = noise.estimate(small, big, b, workers * b)
    # each within Z of its own standard error
    assert est.grad_sq == pytest.approx(delta2, abs=bounds.Z * est.grad_sq_se)
    assert est.trace == pytest.approx(true_trace, abs=bounds.Z * est.trace_se)
    assert abs(est.b_noise - true_trace / delta2) < bounds.Z * est.b_noise_se
    assert (est.steps, est.small_batch, est.big_batch) == (4000, 16, 64)


def test_a_small_batch_larger_than_the_big_one_is_refused():
    with pytest.raises(ValueError, match=r"two batch sizes 0 < b < B \(got b=64, B=32\)"):
        noise.estimate([1.0, 2.0], [0.5, 1.0], 64, 32)


def test_one_worker_or_mismatched_inputs_name_the_problem():
    with pytest.raises(ValueError, match="cannot be estimated from one worker"):
        noise.estimate([1.0], [1.0], 32, 32)
    with pytest.raises(ValueError, match="one \\|G_b\\|\\^2 and one \\|G_B\\|\\^2 per step"):
        noise.estimate([1.0, 2.0], [1.0], 16, 32)


def test_noise_dominated_gradient_has_no_noise_scale():
    # |G_B|^2 at the expected noise floor: the |G|^2 estimate is not positive, B_noise undefined
    est = noise.estimate([10.0, 10.0], [2.4, 2.6], 8, 32)
    assert est.grad_sq <= 0 and est.b_noise is None and est.trace > 0


def test_pool_weights_the_probes_by_their_standard_errors():
    import pandas as pd

    df = pd.DataFrame(
        [
            dict(
                workers=2,
                global_batch=64,
                source="probe",
                status="ok",
                grad_sq=0.3,
                grad_sq_se=0.1,
                grad_trace=40.0,
                grad_trace_se=4.0,
            ),
            dict(
                workers=2,
                global_batch=256,
                source="probe",
                status="ok",
                grad_sq=0.2,
                grad_sq_se=0.05,
                grad_trace=44.0,
                grad_trace_se=2.0,
            ),
            dict(workers=1, global_batch=32, source="probe", status="ok"),  # one worker: none
            dict(workers=2, global_batch=512, source="probe", status="oom"),
            dict(
                workers=2,
                global_batch=64,
                local_batch=16,
                source="sweep",
                status="ok",
                grad_sq=9.0,
                grad_trace=9.0,
            ),
        ]
    )
    got = noise.pool(df)
    # inverse-variance weights 100 and 400
    g2 = (0.3 / 0.01 + 0.2 / 0.0025) / (1 / 0.01 + 1 / 0.0025)
    tr = (40 / 16 + 44 / 4) / (1 / 16 + 1 / 4)
    assert got["grad_sq"] == pytest.approx(g2) and got["grad_trace"] == pytest.approx(tr)
    assert got["b_noise"] == pytest.approx(tr / g2) and got["grad_sq_se"] == pytest.approx(
        (100 + 400) ** -0.5
    )
    assert [(p["workers"], p["global_batch"]) for p in got["probes"]] == [(2, 64), (2, 256)]
    assert [p["b_noise"] for p in got["probes"]] == pytest.approx([40 / 0.3, 44 / 0.2])
    assert noise.pool(df.iloc[2:4]) is None  # no multi-worker estimate
    assert noise.pool(df.assign(grad_sq=-1.0)) is None  # noise-dominated: no scale
    assert noise.pool(df.assign(grad_sq=0.0)) is None  # |G|^2 of exactly 0: none either


def test_finite_population_correction_for_samples_drawn_without_replacement():
    """Tula's sampler draws each step's B samples without replacement from D: the workers' shards
    are disjoint. From a fixed population of D = 400 per-sample gradients, |G|^2 and tr(Sigma)
    (population covariance with 1/(D-1)) are recovered with population=D; McCandlish's
    infinite-population form is biased low by tr(Sigma)/D."""
    rng = np.random.default_rng(1)
    d, D, workers, b = 10, 400, 4, 16
    pop = rng.standard_normal((D, d)) * 2.0 + 0.15  # mean 0.15 per coordinate
    G = pop.mean(0)
    true_g2, true_trace = float((G**2).sum()), float(pop.var(0, ddof=1).sum())
    small, big = [], []
    for _ in range(20000):
        # one step: B samples without replacement, split over workers
        idx = rng.permutation(D)[: workers * b]
        per_worker = [pop[idx[w * b : (w + 1) * b]].mean(0) for w in range(workers)]
        small.append(np.mean([(g**2).sum() for g in per_worker]))
        big.append((np.mean(per_worker, axis=0) ** 2).sum())
    fpc = noise.estimate(small, big, b, workers * b, population=D)
    assert fpc.trace == pytest.approx(true_trace, abs=3 * fpc.trace_se)
    assert fpc.grad_sq == pytest.approx(true_g2, abs=3 * fpc.grad_sq_se)
    naive = noise.estimate(small, big, b, workers * b)
    assert naive.grad_sq < true_g2 - 3 * naive.grad_sq_se  # biased low, by about tr(Sigma)/D = 0.1
    with pytest.raises(ValueError, match="cannot be drawn from 32"):
        noise.estimate(small, big, b, workers * b, population=32)


def test_the_noise_scale_by_hand_whatever_the_gradients_scale():
    """Two steps of |G_b|^2 and |G_B|^2 (b = 16, B = 64): tr(Sigma) = (s - g) / (1/b - 1/B),
    |G|^2 = g - tr / B, their means' ratio; the same at a millionth of the scale (small
    gradients: a trace under 1 is still a trace)."""
    small, big = [0.5, 0.7], [0.2, 0.3]
    for scale in (1.0, 1e-6):
        s, g = [x * scale for x in small], [x * scale for x in big]
        est = noise.estimate(s, g, 16, 64)
        trace = [(a - c) / (1 / 16 - 1 / 64) for a, c in zip(s, g)]
        grad = [c - t / 64 for c, t in zip(g, trace)]
        assert est.trace == pytest.approx(np.mean(trace), rel=1e-12)
        assert est.grad_sq == pytest.approx(np.mean(grad), rel=1e-12)
        assert est.b_noise == pytest.approx(np.mean(trace) / np.mean(grad), rel=1e-12)
        # its standard error: the ratio's, the two means' relative errors in quadrature
        rel = np.hypot(est.trace_se / est.trace, est.grad_sq_se / est.grad_sq)
        assert est.b_noise_se == pytest.approx(est.b_noise * rel)
        assert (est.steps, est.small_batch, est.big_batch) == (2, 16, 64)
        # each mean's standard error over the steps: the sample deviation over sqrt(steps)
        assert est.trace_se == pytest.approx(np.std(trace, ddof=1) / np.sqrt(2))


def test_pool_without_standard_errors_takes_the_plain_mean_and_its_standard_error():
    """Probes with no standard error of their own: equal weights, the mean's standard error
    the sample's standard deviation over the root of their number."""
    import pandas as pd

    g2, tr = np.array([0.2, 0.3, 0.4]), np.array([40.0, 44.0, 50.0])
    df = pd.DataFrame(
        dict(workers=2, global_batch=[64, 128, 256], source="probe", status="ok")
        | dict(grad_sq=g2, grad_trace=tr)
    )
    got = noise.pool(df)
    assert got["grad_sq"] == pytest.approx(g2.mean(), rel=bounds.ROUNDING)
    assert got["grad_sq_se"] == pytest.approx(np.std(g2, ddof=1) / np.sqrt(3), rel=bounds.ROUNDING)
    assert got["grad_trace_se"] == pytest.approx(
        np.std(tr, ddof=1) / np.sqrt(3), rel=bounds.ROUNDING
    )


def test_pool_with_a_zero_standard_error_weighs_the_probes_alike():
    """A standard error of zero cannot weigh a probe (it would take all the weight): the
    probes are then averaged alike."""
    import pandas as pd

    df = pd.DataFrame(
        dict(workers=2, global_batch=[64, 128], source="probe", status="ok")
        | dict(grad_sq=[0.2, 0.4], grad_sq_se=[0.0, 0.1], grad_trace=[40.0, 44.0])
        | dict(grad_trace_se=[1.0, 1.0])
    )
    assert noise.pool(df)["grad_sq"] == pytest.approx(0.3, rel=bounds.ROUNDING)


def test_no_spread_between_the_batches_is_no_noise_scale():
    """|G_b|^2 = |G_B|^2 at every step: the trace estimate is 0, B_noise is not 0 but none."""
    est = noise.estimate([2.0, 3.0], [2.0, 3.0], 8, 32)
    assert est.trace == 0 and est.grad_sq > 0 and est.b_noise is None and est.b_noise_se is None


def test_a_probe_whose_own_gradient_estimate_is_not_positive_has_no_noise_scale_of_its_own():
    """Pooled over two probes |G|^2 is positive; the one probe whose own estimate is negative
    (noise-dominated) lists no B_noise rather than a negative one."""
    import pandas as pd

    rows = [
        dict(workers=2, global_batch=64, grad_sq=0.3, grad_sq_se=0.05, grad_trace=40.0),
        dict(workers=2, global_batch=256, grad_sq=-0.1, grad_sq_se=0.5, grad_trace=44.0),
    ]
    df = pd.DataFrame([r | dict(source="probe", status="ok", grad_trace_se=4.0) for r in rows])
    got = noise.pool(df)
    assert got["grad_sq"] > 0
    assert [p["b_noise"] for p in got["probes"]] == [pytest.approx(40 / 0.3), None]


def test_pooled_probes_without_spread_between_their_batches_have_no_noise_scale():
    """Every probe's trace estimate is 0 (|G_b|^2 = |G_B|^2): the pool has no B_noise, as one
    probe alone has none, rather than a noise scale of 0."""
    import pandas as pd

    df = pd.DataFrame(
        dict(workers=2, global_batch=[64, 128], source="probe", status="ok")
        | dict(grad_sq=[0.2, 0.4], grad_trace=[0.0, 0.0])
    )
    assert noise.pool(df) is None


def test_a_small_batch_gradient_smaller_than_the_big_ones_has_no_noise_scale():
    """|G_b|^2 below |G_B|^2 at every step: the trace estimate is negative, and B_noise is none,
    not a negative batch."""
    est = noise.estimate([1.0, 1.0], [2.0, 2.0], 8, 32)
    assert est.trace < 0 < est.grad_sq and est.b_noise is None
