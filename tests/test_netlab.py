"""The network lab (scripts/netlab.sh) for real: two "nodes" as Linux network namespaces
joined by a bridge, each link shaped with tc tbf; real 4-worker gloo probes placed in them
(cluster.netlab), the two-level sync model fitted on what they measured, and the link
re-shaped while the lab runs. The namespaces are those of conftest's ``lab_cluster`` (the
SLURM lab's nodes, brought up once for both modules; their slurmd sits idle here): these
tests shape its links to RATE and back. Needs root; CI runs as root, and there a lab that
cannot be made fails the tests instead of skipping them."""

import json
import math
import os
import subprocess
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import bounds
from conftest import LAB_RATE, ROOT, train_from_files, venv_env, when_step_reached
from selections import selection_json
from tula.stages import probe
from tula.stages.aggregate import rows_from_probe

LAB = "tula"  # the lab's prefix: namespaces tula-n0, tula-n1 (scripts/slurm-cluster.sh)
NETLAB = [str(ROOT / "scripts" / "netlab.sh")]
RATE, SLOWER = "50mbit", "12mbit"
D_DIGITS = 1437  # digits training samples

# each test compares measured sync times: nothing of the suite runs beside it (`alone`)
pytestmark = [pytest.mark.netlab, pytest.mark.slow, pytest.mark.alone]


def lab(*args: str) -> str:
    r = subprocess.run(
        ["bash", *NETLAB, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "NETLAB_PREFIX": LAB},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def netlab(lab_cluster):
    """The lab's two nodes, their links at RATE while these tests run."""
    lab("rate", RATE)
    try:
        yield LAB
    finally:
        lab("rate", LAB_RATE)


def _config(tmp_path, per_node: int, name: str):
    raw = {
        "workload": {"model": "small_cnn", "dataset": "digits", "epochs": 1, "seed": 0},
        "grid": {"workers": [1, 2, 4], "batch_min": 32, "batch_max": 128},
        "cluster": {"workers_per_node": per_node, "netlab": LAB},
        "probe": {
            "warmup_steps": 2,
            "timed_steps": 10,
            "time_budget_s": 1,
            "timeout_s": 300,
            "sweep_steps": 0,
            "noise_steps": 0,
        },
        "train": {"lr_decay_epochs": []},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _probe(cfg, n, batches, d):
    """The probes at N = ``n``, one job (one process) for all its batches, as the workflow's."""
    recs = probe.run_batches(cfg, n, batches, {b: d / f"N{n}_B{b}.json" for b in batches})
    assert all(r["status"] == "ok" for r in recs.values()), recs
    return recs


@pytest.fixture(scope="module")
def campaign(netlab, tmp_path_factory):
    """A partial search on 2 nodes x 2 workers (the corners and both sides of the node
    boundary: N = 1, 2, 4 at B = 32 and 128), the held-out point N = 4, B = 64, and the
    same 4-worker probe on one node."""
    # this interpreter's torchrun first on PATH (conftest's venv_env)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", venv_env()["PATH"])
        yield _campaign(tmp_path_factory.mktemp("netlab"))


def _campaign(d):
    two, one = _config(d, 2, "two"), _config(d, 4, "one")
    recs = {}
    for n in (1, 2, 4):  # N = 4's job also probes the held-out B = 64
        for b, rec in _probe(two, n, [32, 64, 128] if n == 4 else [32, 128], d).items():
            recs[f"N{n}_B{b}"] = rec
    held = recs.pop("N4_B64")
    one_node = _probe(one, 4, [128], d / "one")[128]
    return d, two, recs, held, one_node


def test_four_workers_on_two_nodes_pay_more_sync_than_on_one(campaign):
    _, _, recs, _, one_node = campaign
    two_nodes = recs["N4_B128"]
    assert two_nodes["nodes"] == 2 and one_node["nodes"] == 1
    assert two_nodes["env"]["comm_env"]["GLOO_SOCKET_IFNAME"] == "lab0"
    # the same step, over the shaped link between the nodes instead of each node's own stack
    assert two_nodes["sync_time_s"] > math.exp(bounds.DRIFT_BOUND) * one_node["sync_time_s"], (
        two_nodes["sync_time_s"],
        one_node["sync_time_s"],
    )


def _table(recs) -> pd.DataFrame:
    return pd.DataFrame([r for rec in recs for r in rows_from_probe(rec, "x")])


def test_the_two_level_model_predicts_across_the_boundary_within_the_noise(campaign):
    """Fitted on the partial search only: the held-out 4-worker point on the far side of the node
    boundary within the noise of this machine. Two cores run 4 workers here: a probe's step-to-step
    CV is 7-11 %, and identical runs differ by much more (BENCHMARKS.md "Nodes and networks":
    0.72-1.60 between runs of one point); this point's held-out error measured within 10 % twice,
    16 % once (bench/netlab_fidelity.py, 12 % median over 6 points). So: within the fixed
    held-out bound of tests/bounds.py (x1.87), as the default DAG's point left out."""
    from tula.model import perf as perfmodel

    _, _, recs, held, _ = campaign
    perf = perfmodel.fit(_table(recs.values()), "ring", workers_per_node=2)
    pred = float(perf.step_time_s(4, 16))
    noise = float(np.std(held["step_times_s"]) / np.mean(held["step_times_s"]))
    err = bounds.log_error(held["step_time_s"], pred)
    assert err <= bounds.HELD_OUT_BOUND, (perf.step.form.name, pred, held["step_time_s"], noise)
    # and it is the two-node step it predicts: above the one-node step at the same local batch
    assert pred > float(perf.step_time_s(2, 16)), (pred, float(perf.step_time_s(2, 16)))


def test_a_slower_link_raises_the_predicted_sync_across_nodes_only(campaign):
    """Re-shape the link live (netlab.sh rate) and probe the two-node points again: the
    re-fitted model predicts more sync for 4 workers on 2 nodes, and the one-node N = 2 step
    as before within the noise (its probes did not cross the link; its sync, a millisecond or
    so, is too small to compare on its own)."""
    from tula.model import perf as perfmodel

    d, two, recs, _, _ = campaign
    before = perfmodel.fit(_table(recs.values()), "ring", workers_per_node=2)
    lab("rate", SLOWER)
    try:
        assert "rate 12Mbit" in lab("status")
        slow = _probe(two, 4, [32, 128], d / "slow")  # one job, as the workflow's
    finally:
        lab("rate", RATE)
    after = perfmodel.fit(
        _table([*[v for k, v in recs.items() if not k.startswith("N4")], *slow.values()]),
        "ring",
        workers_per_node=2,
    )
    assert after.sync_time_s(4, 32) > math.exp(bounds.DRIFT_BOUND) * before.sync_time_s(4, 32)
    # the one-node step is fitted jointly with the rest, so the re-fit may move it, but only
    # within this machine's scatter (the bound of the held-out test above; CI once saw 18 %)
    moved = bounds.log_error(float(after.step_time_s(2, 32)), float(before.step_time_s(2, 32)))
    assert moved <= bounds.TWO_READS_BOUND, moved


def _predictions(perf, epochs: int, path: Path) -> Path:
    """predictions.csv from the fitted model at B = 128 for N = 1, 2 (one node) and 4 (two)."""
    import math

    rows = []
    for n in (1, 2, 4):
        b, spe = 128, math.ceil(D_DIGITS / 128)
        lo, hi = (x[0] for x in perf.step_time_interval_s(np.array([n]), np.array([b // n])))
        step, comp = float(perf.step_time_s(n, b // n)), float(perf.compute_time_s(n, b // n))
        rows.append(
            {
                "workers": n,
                "nodes": 1 if n <= 2 else 2,
                "global_batch": b,
                "local_batch": b // n,
                "compute_time_s": comp,
                "sync_time_s": step - comp,
                "step_time_s": step,
                "step_time_lo_s": float(lo),
                "step_time_hi_s": float(hi),
                "steps_per_epoch": spe,
                "epochs": epochs,
                "train_time_s": epochs * spe * step,
                "train_time_lo_s": epochs * spe * float(lo),
                "train_time_hi_s": epochs * spe * float(hi),
                "cost": epochs * spe * step * n,
                "mem_bytes": 1e6,
                "feasible": True,
                "probe_status": "ok",
            }
        )
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _production(d: Path, name: str, recs, slow_at: float | None, epochs: int = 50):
    """`tula launch` at N = 4, B = 128 on the two lab nodes (launch.replan: move, monitored every
    2 steps) for ``epochs`` (50: long enough that a move pays for its relaunch, 15-35 s here,
    with room), the model fitted on the campaign's probes; with ``slow_at``, the link is
    re-shaped to SLOWER once that share of the steps is done."""
    from tula.io import write_json
    from tula.model import perf as perfmodel

    run = d / name
    run.mkdir()
    raw = yaml.safe_load(_config(d, 2, f"{name}_cfg").read_text())
    raw["workload"]["epochs"], raw["objective"] = epochs, "time"
    raw["launch"] = {"executor": "local", "poll_s": 0.5, "monitor_every_steps": 2, "replan": "move"}
    (run / "config.yaml").write_text(yaml.safe_dump(raw))
    write_json(run / "selection.json", selection_json(4, 128))
    pred = _predictions(
        perfmodel.fit(_table(recs.values()), "ring", workers_per_node=2),
        epochs,
        run / "predictions.csv",
    )
    slow = lambda: lab("rate", SLOWER)  # noqa: E731
    with (
        when_step_reached(run / "train" / "steps.csv", slow_at * epochs * 12, slow)
        if slow_at
        else nullcontext({}) as slowed
    ):
        try:
            final = train_from_files(
                run / "config.yaml", run / "selection.json", run / "train", predictions=pred
            )
        finally:
            if slow_at:
                lab("rate", RATE)
    return run, final, slowed


@pytest.mark.training
def test_a_link_slowed_mid_training_moves_the_job_to_one_node(campaign):
    d, _, recs, _, _ = campaign
    run, final, slowed = _production(d, "move", recs, slow_at=0.3)
    att = json.loads((run / "train" / "attempts.json").read_text())["attempts"]
    # to one node: N = 2 (or N = 1, if the re-fit says so; the test's objective is time)
    assert [(a["workers"] <= 2, a["outcome"]) for a in att] == [
        (False, "moved"),
        (True, "completed"),
    ], [a["reason"] for a in att]
    moved = [x for x in att[0]["drift"] if x["action"] == "moved"]
    assert (
        len(moved) == 1
        and moved[0]["step"] > slowed["step"]
        and "between nodes" in moved[0]["reason"]
    )
    m = pd.read_csv(run / "train" / "metrics.csv")
    assert (
        len(m) == 50 and (m["samples"] == D_DIGITS).all() and final["workers"] == att[1]["workers"]
    )


@pytest.mark.training
def test_the_same_run_with_the_link_unchanged_never_moves(campaign):
    d, _, recs, _, _ = campaign
    # 25 epochs: 150 monitored steps with nothing to find (a move is judged on the same rule at
    # any length; the moving run above has 50 epochs so that its move can pay)
    run, final, _ = _production(d, "stay", recs, slow_at=None, epochs=25)
    att = json.loads((run / "train" / "attempts.json").read_text())["attempts"]
    assert [(a["workers"], a["outcome"]) for a in att] == [(4, "completed")], [
        a["reason"] for a in att
    ]
    assert final["monitored_steps"] > 100 and not [
        x for x in att[0]["drift"] if x["action"] == "moved"
    ]
