"""The candidate forms of the step-time model (tula.model.forms), each against its formula as
the module's docstring and the paper write it, computed here independently: the compute forms
in b and N, the sync terms of each collective, the additive and overlapped steps, the two-level
and bottleneck syncs; their bounds, texts and starting points."""

import numpy as np
import pytest

from tula.model import floor, forms

B = np.array([8.0, 32.0, 100.0, 512.0])
N = np.array([1.0, 2.0, 4.0, 16.0])


def _form(name, max_b=1024.0):
    return {f.name: f for f in forms.compute_forms(max_b)}[name]


def test_each_compute_form_is_its_formula():
    X = {"b": B, "n": N}
    c0, c1, b0, k, k0, k1 = 0.02, 3e-4, 64.0, 0.3, 0.1, 0.7
    sat = c0 + c1 * np.maximum(B - b0, 0.0)
    want = {
        "linear": ((c0, c1), c0 + c1 * B),
        "linear_shared": ((c0, c1, k), (c0 + c1 * B) * (1 + k * (N - 1))),
        "linear_shared_parts": (
            (c0, c1, k0, k1),
            c0 * (1 + k0 * (N - 1)) + c1 * B * (1 + k1 * (N - 1)),
        ),
        "saturating": ((c0, c1, b0), sat),
        "saturating_shared": ((c0, c1, b0, k), sat * (1 + k * (N - 1))),
    }
    assert [f.name for f in forms.compute_forms(1024.0)] == list(want)  # simplest first
    for name, (theta, value) in want.items():
        form = _form(name)
        assert form(np.array(theta), X) == pytest.approx(value, rel=1e-12), name
        assert len(form.params) == len(theta) == len(form.lower) == len(form.upper)
        assert all(lo == 0 for lo in form.lower), name
    # the bend lies within the grid's local batches; a sharing slope at most 10 per worker
    assert _form("saturating", 300.0).upper == (np.inf, np.inf, 300.0)
    assert _form("saturating_shared", 300.0).upper == (np.inf, np.inf, 300.0, 10)
    assert _form("linear_shared_parts").upper == (np.inf, np.inf, 10, 10)


def test_each_collectives_sync_terms():
    assert forms.sync_feature("ring", N) == pytest.approx((N - 1) / N, rel=1e-12)
    assert forms.sync_feature("ps", N) == pytest.approx(N, rel=1e-12)
    assert forms.sync_feature("tree", N) == pytest.approx(np.log2(N), rel=1e-12)
    for collective, latency in (("ring", N - 1), ("ps", N - 1), ("tree", 0 * N)):
        assert forms.LATENCY_TERMS[collective][1](N) == pytest.approx(latency, abs=1e-12)
    with pytest.raises(ValueError, match="hardware.collective.*'mesh'"):
        forms.sync_feature("mesh", N)


def _step_inputs():
    return {"c": np.array([0.01, 0.02, 0.05, 0.2]), "x": (N - 1) / N, "l": N - 1}


def test_additive_and_overlapped_steps_are_their_formulas():
    X = _step_inputs()
    s1, a, g = 0.03, 0.002, 2.5
    s = s1 * X["x"] + a * X["l"]
    by = {f.name: f for f in forms.step_forms("ring", True) + forms.step_forms("ring", False)}
    assert by["additive_latency"](np.array([s1, a]), X) == pytest.approx(X["c"] + s, rel=1e-12)
    assert by["additive"](np.array([s1]), X) == pytest.approx(X["c"] + s1 * X["x"], rel=1e-12)
    overlapped = (X["c"] ** g + s**g) ** (1 / g)
    assert by["overlap_latency"](np.array([s1, a, g]), X) == pytest.approx(overlapped, rel=1e-12)
    # gamma 1 is the additive step; a large gamma tends to the larger of the two
    assert by["overlap"](np.array([s1, 1.0]), X) == pytest.approx(X["c"] + s1 * X["x"], rel=1e-9)
    big = by["overlap"](np.array([s1, 8.0]), X)
    assert (big >= np.maximum(X["c"], s1 * X["x"])).all()
    assert (big[1:] < (X["c"] + s1 * X["x"])[1:]).all()  # N = 1 has no sync to overlap
    # a negative sync is no sync
    assert by["additive"](np.array([-1.0]), X) == pytest.approx(X["c"], rel=1e-12)
    assert by["overlap"].lower == (0, 1.0) and by["overlap"].upper == (np.inf, 8.0)
    assert by["additive_latency"].text == "t_compute + s1*(N-1)/N + a*N-1"
    assert (
        forms.step_form("overlap", "tree").text
        == "(t_compute^gamma + (s1*log2(N))^gamma)^(1/gamma)"
    )
    with pytest.raises(ValueError, match="unknown step form 'sideways'"):
        forms.step_form("sideways", "ring")


def test_two_level_and_bottleneck_syncs_are_their_formulas():
    g, k = np.array([1.0, 2.0, 4.0, 4.0]), np.array([1.0, 1.0, 1.0, 4.0])
    X = {
        "c": np.array([0.01, 0.02, 0.05, 0.2]),
        "xg": (g - 1) / g,
        "xk": (k - 1) / k,
        "x": (g * k - 1) / (g * k),
        "multi": (k > 1).astype(float),
    }
    s_r, s_n = 0.002, 0.04
    by = {f.name: f for f in forms.two_level_forms("ring")}
    two = s_r * X["xg"] + s_n * X["xk"]
    flat = np.where(k > 1, s_n, s_r) * X["x"]
    theta = np.array([s_r, s_n])
    assert by["additive_two_level"](theta, X) == pytest.approx(X["c"] + two, rel=1e-12)
    assert by["additive_bottleneck"](theta, X) == pytest.approx(X["c"] + flat, rel=1e-12)
    assert by["overlap_bottleneck"](np.append(theta, 2.0), X) == pytest.approx(
        np.sqrt(X["c"] ** 2 + flat**2), rel=1e-12
    )
    assert by["additive_two_level"].text == "t_compute + s_r*(g-1)/g + s_n*(k-1)/k"
    assert by["additive_bottleneck"].text == "t_compute + (s_r if k = 1 else s_n)*(N-1)/N"


def test_the_starts_begin_where_the_data_put_them():
    """A step form's first start is the mean exposed sync per unit of x; the latency forms add
    one that splits it with the latency term; the overlap forms try each with gamma 1, 2, 4."""
    X = _step_inputs()
    y = X["c"] + 0.03 * X["x"]
    by = {f.name: f for f in forms.step_forms("ring", True) + forms.step_forms("ring", False)}
    at_one = X["x"] > 0  # N = 1 has no sync: its x is 0 and its (y - c) / x is not counted
    s1 = float(np.mean((y - X["c"])[at_one] / X["x"][at_one])) * 3 / 4
    starts = by["additive"].starts(X, y)
    assert len(starts) == 1 and starts[0][0] == pytest.approx(s1, rel=1e-9)
    lat = by["additive_latency"].starts(X, y)
    assert [len(s) for s in lat] == [2, 2] and lat[1][0] == pytest.approx(lat[0][0] / 2)
    assert lat[1][1] == pytest.approx(lat[0][0] / 2 / X["l"].max(), rel=1e-12)
    gammas = [s[-1] for s in by["overlap_latency"].starts(X, y)]
    assert gammas == [1.0, 2.0, 4.0] * 2
    linear = _form("linear")
    for name in ("linear_shared", "saturating_shared"):  # each start tried unshared and shared
        ks = [
            s[-1]
            for s in _form(name).starts({"b": B, "n": N}, linear(np.array([0.01, 1e-4]), {"b": B}))
        ]
        assert ks == [0.0, 0.5] * (len(ks) // 2)


@pytest.mark.parametrize(
    "group",
    [
        floor.input_forms(),
        forms.step_forms("ring", False) + forms.step_forms("ring", True),
        forms.two_level_forms("ring"),
    ],
    ids=["input", "step", "two_level"],
)
def test_no_fitted_time_may_be_negative_or_fall_as_the_batch_or_n_grows(group):
    """Every coefficient of the input and sync forms is bounded below by 0 (an overlap's gamma
    by 1, plain addition): no negative cost, no time that falls as b or N grows, no sharing
    that speeds the others up (the compute forms: test_each_compute_form_is_its_formula)."""
    for form in group:
        lower = dict(zip(form.params, form.lower))
        gamma = lower.pop("gamma", 1.0)
        assert gamma == 1.0 and all(v == 0 for v in lower.values()), form.name


def test_the_linear_starts_are_the_least_squares_line_and_the_range_of_the_times():
    """The linear form's starts: the least-squares line, and the line from the fastest time
    rising by the times' range over the batches' range; at one local batch the range is over
    one sample (not a division by zero); the parts form tries each with k0 = k1 = 0 and 0.5."""
    X = {"b": B, "n": N}
    y = 0.01 + 1e-4 * B
    line, span = _form("linear").starts(X, y)
    assert line == pytest.approx([0.01, 1e-4], rel=1e-9)
    assert span.tolist() == [y.min(), (y.max() - y.min()) / (B.max() - B.min())]
    one = {"b": np.full(3, 32.0), "n": np.ones(3)}
    assert _form("linear").starts(one, np.array([0.01, 0.02, 0.04]))[1].tolist() == [0.01, 0.03]
    parts = _form("linear_shared_parts").starts(X, y)
    assert [p[2:].tolist() for p in parts] == [[0.0, 0.0], [0.5, 0.5]] * 2
    assert [p[:2].tolist() for p in parts] == [line.tolist()] * 2 + [span.tolist()] * 2


def test_the_saturating_starts_bend_at_each_measured_batch_but_the_last():
    """Flat at 10 ms up to b = 32, then 0.1 ms a sample: a start bends at each measured local
    batch but the largest, level at the mean time up to the bend and rising as the line
    through the points beyond it; with fewer than two distinct batches beyond, not rising."""
    b = np.array([8.0, 32.0, 128.0, 512.0])
    y = 0.01 + 1e-4 * np.maximum(b - 32.0, 0.0)
    starts = _form("saturating").starts({"b": b, "n": np.ones(4)}, y)
    assert [s[2] for s in starts] == [8.0, 32.0, 128.0]
    assert [s[0] for s in starts] == pytest.approx([0.01, 0.01, np.mean(y[:3])], rel=1e-12)
    assert [s[1] for s in starts] == pytest.approx([1e-4, 1e-4, 1e-12], rel=1e-9)
    twice = np.array([8.0, 32.0, 128.0, 128.0])  # beyond 32: two points, one batch
    again = _form("saturating").starts({"b": twice, "n": np.ones(4)}, 0.01 + 1e-4 * twice)
    assert [s[1] for s in again] == pytest.approx([1e-4, 1e-12], rel=1e-9)


def test_the_two_level_starts_split_the_exposed_sync_inside_and_across_nodes():
    """Exposed sync per unit of x: 2 ms where the job stayed on one node, 8 ms where it spanned
    nodes; the starts are those two and (1 ms, 16 ms); overlapped, each with gamma 1, 2, 4.
    With jobs on one node only, the nodes' start is the same; with none on one node, the
    node's start is the mean exposed sync; a step at or below its compute counts as (almost)
    no sync."""
    c = np.full(4, 0.01)
    X = {"c": c, "x": np.array([0.5, 0.75, 0.5, 0.75]), "multi": np.array([0.0, 0.0, 1.0, 1.0])}
    y = c + np.array([0.5, 0.75, 0.5, 0.75]) * np.array([0.002, 0.002, 0.008, 0.008])
    by = {f.name: f for f in forms.two_level_forms("ring")}
    got = by["additive_two_level"].starts(X, y)
    assert np.concatenate(got) == pytest.approx([0.002, 0.008, 0.001, 0.016])
    assert [s[-1] for s in by["overlap_two_level"].starts(X, y)] == [1.0, 2.0, 4.0] * 2
    one_side = {k: v[:2] for k, v in X.items()}
    assert by["additive_bottleneck"].starts(one_side, y[:2])[0] == pytest.approx([0.002, 0.002])
    across = {k: v[2:] for k, v in X.items()}
    inside = float(np.mean(y[2:] - c[2:]))  # no job on one node: the exposed sync itself
    assert by["additive_bottleneck"].starts(across, y[2:])[0] == pytest.approx([inside, 0.008])
    ps = {"c": c[2:], "x": np.array([2.0, 4.0]), "multi": np.array([1.0, 1.0])}
    assert by["additive_two_level"].starts(ps, c[2:])[0].tolist() == [1e-9, 1e-9]
