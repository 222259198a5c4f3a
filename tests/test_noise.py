"""The gradient noise scale estimator (tula.noise): a known answer from linear regression."""

import numpy as np
import pytest

from tula import noise


def regression_gradients(rng, w, w_star, sigma, n):
    """Per-sample gradients of the squared error 0.5 (x.w - y)^2 with x ~ N(0, I_d) and
    y = x.w* + N(0, sigma^2): g_i = x_i (x_i.(w - w*) - eps_i)."""
    x = rng.standard_normal((n, w.size))
    r = x @ (w - w_star) - sigma * rng.standard_normal(n)
    return x * r[:, None]


def test_noise_scale_of_linear_regression_with_known_noise_covariance():
    """For this model E[g] = delta = w - w* and (Isserlis) Sigma = (|delta|^2 + sigma^2) I + delta delta^T,
    so |G|^2 = |delta|^2 and tr(Sigma) = d (|delta|^2 + sigma^2) + |delta|^2: the estimator, fed
    what 4 data-parallel workers at b = 16 and their all-reduced B = 64 would see, recovers both."""
    rng = np.random.default_rng(0)
    d, sigma, workers, b = 20, 1.5, 4, 16
    w_star = rng.standard_normal(d)
    w = w_star + 0.3 * rng.standard_normal(d)
    delta2 = float(((w - w_star) ** 2).sum())
    true_trace = d * (delta2 + sigma**2) + delta2
    small, big = [], []
    for _ in range(4000):  # steps
        per_worker = [regression_gradients(rng, w, w_star, sigma, b).mean(0) for _ in range(workers)]
        small.append(np.mean([(g**2).sum() for g in per_worker]))  # |G_b|^2, the workers' mean
        big.append((np.mean(per_worker, axis=0) ** 2).sum())  # |G_B|^2 of the all-reduced gradient
    est = noise.estimate(small, big, b, workers * b)
    assert est.grad_sq == pytest.approx(delta2, abs=3 * est.grad_sq_se)
    assert est.trace == pytest.approx(true_trace, abs=3 * est.trace_se)
    assert est.b_noise == pytest.approx(true_trace / delta2, rel=0.15)
    assert abs(est.b_noise - true_trace / delta2) < 3 * est.b_noise_se
    assert (est.steps, est.small_batch, est.big_batch) == (4000, 16, 64)


def test_one_worker_or_mismatched_inputs_name_the_problem():
    with pytest.raises(ValueError, match="cannot be estimated from one worker"):
        noise.estimate([1.0], [1.0], 32, 32)
    with pytest.raises(ValueError, match="one \\|G_b\\|\\^2 and one \\|G_B\\|\\^2 per step"):
        noise.estimate([1.0, 2.0], [1.0], 16, 32)


def test_noise_dominated_gradient_has_no_noise_scale():
    # |G_B|^2 at the expected noise floor: the |G|^2 estimate is not positive, B_noise undefined
    est = noise.estimate([10.0, 10.0], [2.4, 2.6], 8, 32)
    assert est.grad_sq <= 0 and est.b_noise is None and est.trace > 0
