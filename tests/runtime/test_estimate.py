"""The step's memory and FLOPs from the model alone (tula.runtime.probe.estimate): Tula's own step
under FakeTensorMode, MemTracker and FlopCounterMode, no data and no device."""

import pytest

import bounds
from tula import config
from tula.runtime.probe.estimate import estimate_step
from user_workload import HIDDEN

D, K = 64, 10  # digits' 1 x 8 x 8 samples, 10 classes


def _cfg(model: str, **train):
    return config.from_dict(
        {"workload": {"model": model}, "train": {"method": "lbt", "precision": "fp32", **train}}
    )


def test_a_linear_stack_has_the_memory_counted_by_hand(user_pythonpath):
    """Flatten, Linear(64, 256), ReLU, Linear(256, 10), SGD with momentum, fp32, on the CPU
    (no DDP buckets). At the step's peak (ReLU's backward, once batches are large enough that
    activations outweigh the first layer's weight gradient) the worker holds: the parameters P
    and their momentum P, the second layer's gradient (the first's is not made yet); per sample
    the input x (64 floats) and the ReLU's output (256), both saved for backward, the
    pre-activation's gradient and the ReLU's gradient (256 each), and the int64 label."""
    cfg = _cfg("user_workload:linear_stack")
    est = estimate_step(cfg, (1, 8, 8), K, (64, 512), device="cpu")
    p_bytes = 4 * (D * HIDDEN + HIDDEN + HIDDEN * K + K)
    second_layer_grad = 4 * (HIDDEN * K + K)
    assert est.parameter_bytes == p_bytes
    assert est.fixed_bytes == pytest.approx(2 * p_bytes + second_layer_grad, abs=64)
    assert est.per_sample_bytes == pytest.approx(4 * (D + 3 * HIDDEN) + 8, abs=1)
    # the terms at the peak, by kind (MemTracker's)
    at_512 = est.terms["512"]
    assert at_512["param"] == at_512["opt"] == p_bytes and at_512["grad"] == second_layer_grad
    # 2 FLOPs a multiply-add: forward, both weight gradients, and the input gradient of the
    # second layer only (the first's input needs none)
    assert est.flops_per_sample == 2 * (2 * (D * HIDDEN + HIDDEN * K) + HIDDEN * K)


def test_a_cuda_worker_adds_ddps_buckets_and_ags_its_refresh(user_pythonpath):
    """For CUDA the estimate adds one gradient-sized copy (DDP's buckets, which
    max_memory_allocated sees); with AGS, the refresh's four gradient copies, which at a small
    batch outweigh the plain step's peak."""
    cpu = estimate_step(_cfg("user_workload:linear_stack"), (1, 8, 8), K, (64, 512), "cpu")
    cuda = estimate_step(_cfg("user_workload:linear_stack"), (1, 8, 8), K, (64, 512), "cuda")
    assert cuda.fixed_bytes - cpu.fixed_bytes == pytest.approx(cpu.parameter_bytes)
    assert cuda.per_sample_bytes == pytest.approx(cpu.per_sample_bytes)
    ags = estimate_step(
        _cfg("user_workload:linear_stack", method="ags", ags_small_batch=8),
        (1, 8, 8),
        K,
        (1, 2),
        "cpu",
    )
    p = ags.parameter_bytes
    assert ags.refresh_bytes is not None
    assert ags.peak_bytes[0] == ags.refresh_bytes["1"] >= 2 * p + 4 * p  # P + momentum + 4 copies


def test_bf16_keeps_activations_in_16_bits():
    """train.precision bf16 runs the step under autocast: a shipped conv net's activations per
    sample come out at roughly half their fp32 size; the parameters stay fp32."""
    f32 = estimate_step(_cfg("resnet_tiny"), (1, 8, 8), K, (16, 64), "cuda")
    b16 = estimate_step(_cfg("resnet_tiny", precision="bf16"), (1, 8, 8), K, (16, 64), "cuda")
    assert b16.parameter_bytes == f32.parameter_bytes
    share = b16.per_sample_bytes / f32.per_sample_bytes
    assert abs(share - bounds.BF16_SHARE) < bounds.BF16_SLACK


def test_a_model_that_reads_its_values_is_named_not_estimated(user_pythonpath):
    with pytest.raises(RuntimeError, match=r"workload.model.*user_workload:reads_its_values"):
        estimate_step(_cfg("user_workload:reads_its_values"), (1, 8, 8), K, (4, 8), "cpu")
