import json
import os
import re
import subprocess

import numpy as np
import pandas as pd
import pytest
import yaml

from bounds import check_accuracy
from conftest import copy_workflow
from tula import config
from tula.io import write_json
from tula.stages.compare.cells import Metric
from tula.stages.compare.collect import collect, targets, time_to_target
from tula.stages.compare.heatmap import heatmap
from tula.stages.compare.runs import find, run_ids, runs
from tula.stages.compare.table import table_markdown


def test_runs_enumerate_the_suite():
    cfg = config.from_dict(
        {"compare": {"batches": [64, 128], "methods": ["lbt", "ags"], "seeds": 3}}
    )
    rs = runs(cfg)
    assert len(rs) == 2 * 2 * 2 * 3  # 2 default workloads x 2 batches x 2 methods x 3 seeds
    assert len(set(run_ids(cfg))) == len(rs)
    assert (
        find(cfg, "small_cnn__mnist1d__B128__ags__s2")
        == rs[[r.id for r in rs].index("small_cnn__mnist1d__B128__ags__s2")]
    )
    with pytest.raises(ValueError, match="compare.batches"):
        find(cfg, "small_cnn__mnist1d__B256__ags__s0")  # B=256 is not in compare.batches


def test_time_to_target_sums_step_time_to_the_first_epoch_at_the_target():
    epochs = [
        {"test_acc": 0.5, "epoch_time_s": 2.0},
        {"test_acc": 0.79, "epoch_time_s": 3.0},
        {"test_acc": 0.81, "epoch_time_s": 4.0},
        {"test_acc": 0.7, "epoch_time_s": 5.0},
    ]
    assert time_to_target(epochs, 0.8) == (9.0, 3)
    assert time_to_target(epochs, 0.5) == (2.0, 1)  # at the target counts
    t, e = time_to_target(epochs, 0.9)
    assert np.isnan(t) and e == -1
    # a metric where smaller is better (train.metric_goal: min): the first epoch at or below
    assert time_to_target(epochs, 0.72, "min") == (2.0, 1)
    assert time_to_target(epochs[1:], 0.72, "min") == (12.0, 3)


def _row(b, m, seed, acc, status="ok"):
    return dict(
        model="m", dataset="d", global_batch=b, method=m, seed=seed, status=status, test_acc=acc
    )


def test_table_marks_best_and_summarises_ags_against_lbt():
    rows = []
    for b, accs in (
        (256, {"lbt": (0.80, 0.82), "lrs": (0.90, 0.92), "ags": (0.905, 0.905)}),
        (1024, {"lbt": (0.60, 0.62), "lrs": (0.70, 0.70), "ags": (0.75, 0.77)}),
    ):
        for m, (a0, a1) in accs.items():
            for seed, acc in enumerate((a0, a1)):
                rows.append(_row(b, m, seed, acc))
    md = table_markdown(pd.DataFrame(rows))
    assert "| m | d | 1024 | 61.00 ± 1.41 | 70.00 ± 0.00 | **76.00 ± 1.41** |" in md
    assert "**91.00 ± 1.41**" in md  # LRS best at B=256 ...
    assert "AGS − LBT, averaged over the 2 rows: +12.25 points." in md  # ((90.5-81) + (76-61)) / 2
    assert "AGS best or within 1 point of the best in 2/2 rows." in md  # 90.5 is within 1 of 91
    assert "Time to target" not in md  # no target, no second table


def test_a_metric_where_smaller_is_better_is_tabled_under_its_name_and_goal(tmp_path):
    """train.metric user_workload:error_rate with metric_goal min: the table says the metric's
    name, shows it as it is (not x100), bolds the smallest, and the workload's target is the
    best mean over target_fraction (0.1 / 0.8 = 0.125), reached at or below it."""
    cfg = config.from_dict(
        {
            "compare": {"workloads": [{"model": "m", "dataset": "d"}], "target_fraction": 0.8},
            "train": {"metric": "user_workload:error_rate", "metric_goal": "min"},
        }
    )
    metric = Metric.of(cfg.train)
    errors = {"lbt": (0.3, 0.2), "ags": (0.1, 0.1)}
    rows = [_row(1024, m, seed, e) for m, errs in errors.items() for seed, e in enumerate(errs)]
    md = table_markdown(pd.DataFrame(rows), metric)
    assert "| m | d | 1024 | 0.25 ± 0.071 | **0.1 ± 0** |" in md
    assert "Test error_rate (smaller is better), mean ± std over 2 seeds" in md
    assert "AGS − LBT, averaged over the 1 rows: -0.15." in md and "within 1 point" not in md
    assert targets(cfg, pd.DataFrame(rows)) == {("m", "d"): pytest.approx(0.125)}
    assert heatmap(pd.DataFrame(rows), tmp_path / "h.png", metric) is not None
    assert metric.show(0.125) == "error_rate 0.125" and Metric().show(0.5) == "accuracy 50.00%"


def _result(tmp_path, b, m, seed, accs, status="ok", step_s=1.0):
    rec = {
        "run": f"m__d__B{b}__{m}__s{seed}",
        "model": "m",
        "dataset": "d",
        "global_batch": b,
        "method": m,
        "seed": seed,
        "status": status,
        "error": "" if status == "ok" else "out of memory ...",
        "epochs": [{"epoch": i, "test_acc": a, "epoch_time_s": step_s} for i, a in enumerate(accs)],
    }
    if status == "ok":
        rec.update(test_acc=accs[-1], best_test_acc=max(accs), train_time_s=step_s * len(accs))
    path = tmp_path / rec["run"] / "result.json"
    write_json(path, rec)
    return path


def test_aggregate_rows_time_to_target_and_runs_that_did_not_train(tmp_path):
    cfg = config.from_dict(
        {
            "compare": {
                "workloads": [{"model": "m", "dataset": "d"}],
                "batches": [64, 128],
                "methods": ["lbt", "ags"],
                "seeds": 2,
                "target_fraction": 0.9,
            }
        }
    )
    files = [
        _result(tmp_path, 64, "lbt", 0, [0.5, 0.8, 0.9]),
        _result(tmp_path, 64, "lbt", 1, [0.6, 0.85, 0.9]),
        _result(tmp_path, 64, "ags", 0, [0.7, 0.9, 1.0]),
        _result(tmp_path, 64, "ags", 1, [0.8, 0.95, 1.0]),
        _result(tmp_path, 128, "lbt", 0, [0.3, 0.5, 0.6], step_s=0.5),
        _result(tmp_path, 128, "lbt", 1, [0.4, 0.6, 0.7], step_s=0.5),
        _result(tmp_path, 128, "ags", 0, [0.5, 0.9, 0.95], step_s=0.5),
        _result(tmp_path, 128, "ags", 1, [], status="oom"),
    ]
    df = collect(cfg, files)
    # the target: 0.9 x the best mean final accuracy (AGS at B=64: 1.0)
    assert targets(cfg, df) == {("m", "d"): pytest.approx(0.9)}
    t = df.set_index(["global_batch", "method", "seed"])
    assert (
        t.loc[(64, "lbt", 0), "time_to_target_s"] == 3.0
        and t.loc[(64, "lbt", 0), "epochs_to_target"] == 3
    )
    assert t.loc[(64, "ags", 1), "time_to_target_s"] == 2.0  # 0.95 >= 0.9 in epoch 2
    assert t.loc[(128, "ags", 0), "time_to_target_s"] == 1.0  # two epochs of 0.5 s
    assert np.isnan(t.loc[(128, "lbt", 0), "time_to_target_s"])  # never reached 0.9
    assert t.loc[(128, "ags", 1), "status"] == "oom" and np.isnan(
        t.loc[(128, "ags", 1), "test_acc"]
    )
    md = table_markdown(df)
    # the OOM seed is not counted
    assert "| m | d | 128 | not reached (0/2) | **1.00 s (1/1)** |" in md
    assert "| m | d | 64 | 3.00 s (2/2) | **2.00 s (2/2)** |" in md  # medians of (3, 3) and (2, 2)
    assert "Not trained: B=128 ags seed 1 (oom)." in md and "m / d: 90.00%" in md


def test_a_seed_that_never_reaches_the_target_counts_as_infinitely_slow(tmp_path):
    # 3 seeds each: LARS reaches 0.9 in 2 of 3 (after 1 s and 3 s), LRS in 1 of 3 (after 1 s).
    # The median over seeds is the slower reached seed for LARS, none for LRS: a method that
    # mostly misses the target is not "fastest" on its one lucky seed.
    cfg = config.from_dict(
        {
            "compare": {
                "workloads": [{"model": "m", "dataset": "d", "target_accuracy": 0.9}],
                "batches": [64],
                "methods": ["lars", "lrs"],
                "seeds": 3,
            }
        }
    )
    files = [
        _result(tmp_path, 64, "lars", 0, [0.95]),
        _result(tmp_path, 64, "lars", 1, [0.5, 0.6, 0.95]),
        _result(tmp_path, 64, "lars", 2, [0.5, 0.6, 0.7]),
        _result(tmp_path, 64, "lrs", 0, [0.95]),
        _result(tmp_path, 64, "lrs", 1, [0.5, 0.6]),
        _result(tmp_path, 64, "lrs", 2, [0.5, 0.6]),
    ]
    md = table_markdown(collect(cfg, files))
    assert "| m | d | 64 | **3.00 s (2/3)** | median not reached (1/3) |" in md
    assert "one that never reached it counting as infinitely slow" in md
    fig = heatmap(collect(cfg, files), tmp_path / "h.png")
    acc, ttt = fig.axes[:2]  # the two panels (their colour bars come after)
    assert [t.get_text() for t in acc.texts] == [
        "86.7",
        "71.7",
    ]  # mean final accuracy: (95+95+70)/3, (95+60+60)/3
    assert [t.get_text() for t in ttt.texts] == [
        "3.0",
        "—",
    ]  # LRS's median never reached: no colour, "—"
    assert [t.get_fontweight() for t in ttt.texts] == ["bold", "normal"]
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.training
def test_compare_run_trains_one_run_and_records_an_oom_without_relaunching(tmp_path, venv_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "compare": {
                    "workloads": [{"model": "small_cnn", "dataset": "digits"}],
                    "batches": [128],
                    "methods": ["ags"],
                    "seeds": 1,
                    "epochs": 1,
                }
            }
        )
    )
    run = "small_cnn__digits__B128__ags__s0"
    out = tmp_path / "runs" / run / "result.json"
    r = subprocess.run(
        ["tula", "compare", "run", "--config", str(cfg), "--run", run, "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    final = json.loads((out.parent / "final.json").read_text())
    assert (
        res["status"] == "ok"
        and final["method"] == "ags"
        and (final["workers"], final["global_batch"]) == (2, 128)
    )
    assert res["test_acc"] == final["final_test_acc"] and len(res["epochs"]) == 1
    # one epoch of 12 steps learns past chance (0.1 over the 360 test samples): as recorded
    check_accuracy("compare one run, ags N2 B128 seed 0", res["test_acc"])
    # an OOM is the cell's result: recorded, the job not relaunched at a smaller B
    out2 = tmp_path / "oom" / run / "result.json"
    env = dict(os.environ, TULA_INJECT_FAULT="oom:step=3,rank=1,batch=128")
    r = subprocess.run(
        ["tula", "compare", "run", "--config", str(cfg), "--run", run, "--out", str(out2)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out2.read_text())
    att = json.loads((out2.parent / "attempts.json").read_text())
    assert res["status"] == "oom" and "B=128" in res["error"], res
    assert [a["outcome"] for a in att["attempts"]] == ["oom"] and att["outcome"] == "oom"
    assert not (out2.parent / "final.json").exists()


SUITE = {
    "compare": {
        "workloads": [{"model": "small_cnn", "dataset": "digits", "target_accuracy": 0.5}],
        "batches": [64, 128],
        "methods": ["lbt", "ags"],
        "seeds": 1,
        "workers": 1,
        "epochs": 2,
    }
}


@pytest.mark.dag
def test_the_suite_is_a_snakemake_fan_out_in_parallel(tmp_path, venv_path):
    copy_workflow(tmp_path)
    (tmp_path / "workflow" / "config.yaml").write_text("{}\n")
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(SUITE))

    def snakemake(*args):
        r = subprocess.run(
            ["snakemake", "--cores", "2", "compare", "--configfile", "suite.yaml", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
        return r.stdout + r.stderr

    snakemake()
    res = tmp_path / "results"
    runs_ = sorted((res / "compare" / "runs").glob("*/result.json"))
    # 1 workload x 2 batches x 2 methods x 1 seed, one job each with its log and benchmark
    assert len(runs_) == 4
    for p in runs_:
        assert (res / "logs" / "compare" / f"{p.parent.name}.log").exists()
        assert (
            pd.read_csv(res / "benchmarks" / "compare" / f"{p.parent.name}.tsv", sep="\t")[
                "s"
            ].item()
            > 0
        )
    recs = [json.loads(p.read_text()) for p in runs_]
    # one worker per run on 2 cores: two runs at a time, so some ran side by side
    spans = sorted((r["started"], r["ended"]) for r in recs)
    assert any(a[1] > b[0] for a, b in zip(spans, spans[1:])), spans
    df = pd.read_csv(res / "compare" / "accuracy.csv")
    assert len(df) == 4 and (df["status"] == "ok").all() and (df["target_acc"] == 0.5).all()
    for r in recs:  # each row is its run's own result
        row = df[(df["global_batch"] == r["global_batch"]) & (df["method"] == r["method"])].iloc[0]
        assert row["test_acc"] == r["test_acc"] and row["epochs"] == 2
    assert "### Time to target accuracy" in (res / "compare" / "table.md").read_text()
    assert (res / "compare" / "heatmap.png").read_bytes()[:4] == b"\x89PNG"
    # finished runs are outputs: nothing to do; a new batch would train only its runs (the
    # plan), a new target retrains none (run: the table made again from the same runs)
    assert "Nothing to be done" in snakemake("-n")
    mtimes = {p: p.stat().st_mtime_ns for p in runs_}
    SUITE2 = json.loads(json.dumps(SUITE))
    SUITE2["compare"]["batches"].append(32)
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(SUITE2))
    out = snakemake("-n")
    assert sorted(re.findall(r"wildcards: run=(\S+)", out)) == [
        "small_cnn__digits__B32__ags__s0",
        "small_cnn__digits__B32__lbt__s0",
    ], out
    SUITE2["compare"]["batches"].remove(32)
    SUITE2["compare"]["workloads"][0]["target_accuracy"] = 0.6
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(SUITE2))
    assert not re.findall(r"wildcards: run=(\S+)", snakemake("-n"))
    snakemake()
    assert {p: p.stat().st_mtime_ns for p in runs_} == mtimes
    df = pd.read_csv(res / "compare" / "accuracy.csv")
    assert len(df) == 4 and (df["target_acc"] == 0.6).all()
