"""``tula <stage>``: one subcommand per arrow of the data flow (see README, "Results files").

    check      config + model + dataset    -> results/workload.json
    probe      (N, B)                      -> results/probes/N{n}_B{b}.json
    aggregate  results/probes/*.json       -> results/measurements.csv
    fit        measurements.csv            -> results/model/{memory,perf}.json
    predict    model + grid                -> results/predictions.csv
    select     predictions.csv + objective -> results/selection.json
    plot       csv/json above              -> results/plots/*.png
    launch     selection.json              -> results/train/{metrics.csv,final.json,model.pt,attempts.json}
    report     everything above            -> results/report.html

Each reads files and writes files (atomically), so any stage can be re-run alone or fed
data that did not come from a probe.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from tula.config import ConfigError

EXAMPLES = """examples:
  tula probe --config workflow/config.yaml --nodes 2 --global-batch 64 --out results/probes/N2_B64.json
  tula fit --config workflow/config.yaml --measurements results/measurements.csv --out-dir results/model
  tula select --config workflow/config.yaml --predictions results/predictions.csv --out results/selection.json
"""


def _cfg_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, metavar="YAML",
                   help="Tula config (workflow/config.yaml, or the snapshot Snakemake passes); validated on load")  # fmt: skip


def cmd_probe(a) -> None:
    from tula import probe

    probe.run(a.config, a.nodes, a.global_batch, a.out)


def cmd_aggregate(a) -> None:
    from tula import measurements

    df = measurements.aggregate(a.probes, a.out)
    ok = int((df["status"] == "ok").sum())
    print(f"[aggregate] {len(df)} probes ({ok} ok, {len(df) - ok} failed) -> {a.out}")


def cmd_fit(a) -> None:
    from tula import config, measurements, memory, perfmodel
    from tula.io import write_json

    cfg = config.load(a.config)
    df = measurements.load(a.measurements)
    if not (df["status"] == "ok").any():
        raise ValueError(f"{a.measurements}: no probe succeeded (statuses: {', '.join(sorted(set(df['status'])))}); "
                         "nothing to fit. Look at the probe logs under logs/probe/.")  # fmt: skip
    mem = memory.fit(df, cfg.hardware.memory_budget_bytes)
    perf = perfmodel.fit(df, cfg.hardware.collective)
    out = Path(a.out_dir)
    write_json(out / "memory.json", {**mem.to_dict(), "search": cfg.search})
    write_json(out / "perf.json", {**perf.to_dict(), "search": cfg.search, "probes_fitted": int((df["status"] == "ok").sum())})
    c, s = perf.compute, perf.sync
    print(f"[fit] compute_time_s = {c.intercept:.3g} + {c.slope:.3g} * b   (R^2 {c.r2:.3f}, {c.n_points} probes)")
    print(f"[fit] sync_time_s    = {s.intercept:.3g} + {s.slope:.3g} * {perfmodel.COLLECTIVE_TERMS[perf.collective][0]}")
    print(f"[fit] memory_bytes   = {mem.fit.intercept:.4g} + {mem.fit.slope:.4g} * b;  largest feasible b: "
          f"{mem.max_local_batch() if mem.max_local_batch() is not None else 'unbounded'}  -> {out}/")  # fmt: skip


def _train_samples(a, cfg, df: pd.DataFrame) -> int:
    if a.train_samples:
        return a.train_samples
    if "train_samples" in df.columns and df["train_samples"].notna().any():
        return int(df["train_samples"].dropna().iloc[0])
    from tula import data

    return data.load_config(cfg).train_size


def cmd_predict(a) -> None:
    from tula import config, measurements, memory, perfmodel
    from tula.io import read_json, write_csv

    cfg = config.load(a.config)
    df = measurements.load(a.measurements)
    perf = perfmodel.PerfModel.from_dict(read_json(Path(a.model_dir) / "perf.json"))
    mem = memory.MemoryModel.from_dict(read_json(Path(a.model_dir) / "memory.json"))
    D = _train_samples(a, cfg, df)
    pred = perfmodel.predict(cfg, perf, mem, D, df)
    write_csv(a.out, pred)
    print(f"[predict] {len(pred)} grid points ({int(pred['feasible'].sum())} feasible), D={D} samples, "
          f"E={cfg.workload.epochs} epochs -> {a.out}")  # fmt: skip


def cmd_select(a) -> None:
    from tula import config
    from tula.io import write_json
    from tula.select import select

    cfg = config.load(a.config)
    pred = pd.read_csv(a.predictions)
    sel = select(pred, cfg)
    write_json(a.out, sel)
    s = sel["selected"]
    print(f"[select] objective {sel['objective']}: N={s['nodes']} B={s['global_batch']} — {sel['reason']} -> {a.out}")


def cmd_plot(a) -> None:
    from tula import plots
    from tula.io import read_json

    out = Path(a.out_dir)
    made = []
    if a.selection:
        if not (a.predictions and a.measurements and a.model_dir):
            raise ValueError("plot: --selection needs --predictions, --measurements and --model-dir")
        pred, sel = pd.read_csv(a.predictions), read_json(a.selection)
        plots.time_vs_batch(pred, sel, out / "time_vs_batch.png")
        plots.cost_vs_batch(pred, sel, out / "cost_vs_batch.png")
        plots.memory_vs_batch(pred, pd.read_csv(a.measurements), read_json(Path(a.model_dir) / "memory.json"),
                              out / "memory_vs_batch.png")  # fmt: skip
        made += ["time_vs_batch.png", "cost_vs_batch.png", "memory_vs_batch.png"]
    if a.metrics:
        if not a.final:
            raise ValueError("plot: --metrics needs --final")
        attempts = read_json(a.attempts) if a.attempts else None
        plots.training_curve(pd.read_csv(a.metrics), read_json(a.final), out / "training.png", attempts)
        made.append("training.png")
    if not made:
        raise ValueError("plot: nothing to plot; give --selection (with --predictions, --measurements, --model-dir) "
                         "and/or --metrics with --final")  # fmt: skip
    print(f"[plot] {', '.join(made)} -> {out}/")


def cmd_launch(a) -> None:
    from tula import launch

    final = launch.run(a.config, a.selection, a.out_dir, predictions=a.predictions, executor_hint=a.executor_hint,
                       timeout_min=a.timeout_min, partition=a.slurm_partition or None,
                       account=a.slurm_account or None, fresh=a.fresh)  # fmt: skip
    print(f"[launch] done: N={final['nodes']} B={final['global_batch']}, test accuracy "
          f"{100 * final['final_test_acc']:.2f}% -> {a.out_dir}/ (final.json, metrics.csv, model.pt, attempts.json)")


def cmd_report(a) -> None:
    from tula import report
    from tula.io import read_json

    plots = [Path(a.plots_dir) / n for n in ("time_vs_batch.png", "cost_vs_batch.png", "memory_vs_batch.png", "training.png")]
    report.render(read_json(a.selection), pd.read_csv(a.predictions), pd.read_csv(a.measurements),
                  read_json(a.final), plots, a.out, attempts=read_json(a.attempts) if a.attempts else None)  # fmt: skip
    print(f"[report] -> {a.out}")


def cmd_compare(a) -> None:
    from tula import compare

    compare.run_suite(a.config, a.out_dir)
    print(f"[compare] -> {a.out_dir}/accuracy.csv, table.md, heatmap.png")
    print((Path(a.out_dir) / "table.md").read_text())


def cmd_models(a) -> None:
    from tula.models import available

    for name in available():
        print(name)
    print("tv_<name>: any other torchvision classification model; package.module:callable: your own")


def cmd_check(a) -> None:
    from tula import config
    from tula.grid import grid, search_set
    from tula.io import write_json

    cfg = config.load(a.config)
    pts = search_set(cfg)
    print(f"{a.config}: valid. {len(grid(cfg))} grid points; {cfg.search} search probes {len(pts)}: "
          + ", ".join(p.name for p in pts))  # fmt: skip
    if a.config_only:
        return
    from tula.models import check_workload

    w = check_workload(cfg)
    print(f"workload: {w['dataset']}: {w['train_samples']} training / {w['test_samples']} test samples of shape "
          f"{tuple(w['input_shape'])}, {w['num_classes']} classes; model {w['model']}: {w['parameters']:,} parameters, "
          f"forward on a sample batch ok")  # fmt: skip
    if a.out:
        write_json(a.out, w)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tula", description=__doc__, epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = p.add_subparsers(dest="stage", required=True, metavar="STAGE")

    s = sub.add_parser("probe", help="run one short DDP probe at (N, B) and record step time and memory",
                       description="Launch N workers (torchrun locally), time synced and no-sync steps at local batch "
                                   "B/N, count memory (Eq. 3), and write the probe record. A failed probe "
                                   "(oom/error/timeout) is recorded with its status and exits 0.")  # fmt: skip
    _cfg_arg(s)
    s.add_argument("--nodes", type=int, required=True, help="N: number of data-parallel workers")
    s.add_argument("--global-batch", type=int, required=True, help="B: global batch size (divisible by N)")
    s.add_argument("--out", required=True, help="probe record to write (results/probes/N{n}_B{b}.json)")
    s.set_defaults(func=cmd_probe)

    s = sub.add_parser("aggregate", help="collect probe records into measurements.csv",
                       description="Collect probe JSON records into one CSV, one row per probe, failed ones included.")  # fmt: skip
    s.add_argument("probes", nargs="+", help="probe JSON files (results/probes/*.json)")
    s.add_argument("--out", required=True, help="CSV to write (results/measurements.csv)")
    s.set_defaults(func=cmd_aggregate)

    s = sub.add_parser("fit", help="fit the memory (Eq. 3) and step-time (Eq. 2) models",
                       description="Fit peak memory and compute time linear in local batch, and sync time linear in "
                                   "the collective's N-term (statsmodels OLS), on the ok rows of a measurements CSV.")  # fmt: skip
    _cfg_arg(s)
    s.add_argument("--measurements", required=True, help="measurements CSV (see README for its columns)")
    s.add_argument("--out-dir", required=True, help="directory for memory.json and perf.json (results/model)")
    s.set_defaults(func=cmd_fit)

    s = sub.add_parser("predict", help="predict step time, T, C and memory at every grid point",
                       description="Predict every (N, B) of the config's grid, probed or not: step time, training "
                                   "time T (Eq. 4a), cost C (Eq. 4b), memory and feasibility.")  # fmt: skip
    _cfg_arg(s)
    s.add_argument("--measurements", required=True, help="measurements CSV (to mark probed points and OOMs)")
    s.add_argument("--model-dir", required=True, help="directory with memory.json and perf.json")
    s.add_argument("--train-samples", type=int, default=None,
                   help="D, training samples per epoch (default: from the probes, else from the dataset)")  # fmt: skip
    s.add_argument("--out", required=True, help="CSV to write (results/predictions.csv)")
    s.set_defaults(func=cmd_predict)

    s = sub.add_parser("select", help="choose (N, B) for the objective: time, cost or knee",
                       description="Pick the configuration for config key `objective` among feasible points inside "
                                   "`constraints`; write the choice, the runner-up and why.")  # fmt: skip
    _cfg_arg(s)
    s.add_argument("--predictions", required=True, help="predictions CSV from `tula predict`")
    s.add_argument("--out", required=True, help="JSON to write (results/selection.json)")
    s.set_defaults(func=cmd_select)

    s = sub.add_parser("plot", help="draw time/cost/memory-vs-batch and training-curve figures",
                       description="Draw figures from the results files. --selection (with --predictions, "
                                   "--measurements, --model-dir) draws time_vs_batch, cost_vs_batch, memory_vs_batch; "
                                   "--metrics with --final draws training.png.")  # fmt: skip
    s.add_argument("--predictions", help="predictions CSV")
    s.add_argument("--selection", help="selection JSON")
    s.add_argument("--measurements", help="measurements CSV")
    s.add_argument("--model-dir", help="directory with memory.json")
    s.add_argument("--metrics", help="training metrics CSV (results/train/metrics.csv)")
    s.add_argument("--final", help="training final JSON (results/train/final.json)")
    s.add_argument("--attempts", help="training attempts JSON (results/train/attempts.json): marks relaunches")
    s.add_argument("--out-dir", required=True, help="directory for the PNG files (results/plots)")
    s.set_defaults(func=cmd_plot)

    for name in ("launch", "train"):
        s = sub.add_parser(name, help="submit the production training job at the selected (N, B) and watch it"
                           + (" (alias of launch)" if name == "train" else ""),
                           description="Submit the training job with submitit (SLURM or local processes), echo its "
                                       "progress, requeue it on preemption/timeout from its checkpoint, and relaunch "
                                       "it at the next smaller batch after an out-of-memory error. Writes "
                                       "metrics.csv, final.json, model.pt, attempts.json and checkpoints/.")  # fmt: skip
        _cfg_arg(s)
        s.add_argument("--selection", required=True, help="selection JSON from `tula select`")
        s.add_argument("--out-dir", required=True, help="directory for the training results (results/train)")
        s.add_argument("--predictions", help="predictions CSV: the memory model's order of smaller batches after an OOM")
        s.add_argument("--executor-hint", choices=["local", "slurm"],
                       help="what launch.executor: auto means (the train rule passes Snakemake's executor)")  # fmt: skip
        s.add_argument("--timeout-min", type=int, help="job wall time when launch.timeout_min is null (rule runtime)")
        s.add_argument("--slurm-partition", help="partition when launch.slurm_partition is null (profile's)")
        s.add_argument("--slurm-account", help="account when launch.slurm_account is null (profile's)")
        s.add_argument("--fresh", action="store_true", help="ignore existing checkpoints and start over")
        s.set_defaults(func=cmd_launch)

    s = sub.add_parser("report", help="render results/report.html",
                       description="Render one self-contained HTML page from the results files.")  # fmt: skip
    s.add_argument("--selection", required=True, help="selection JSON")
    s.add_argument("--predictions", required=True, help="predictions CSV")
    s.add_argument("--measurements", required=True, help="measurements CSV")
    s.add_argument("--final", required=True, help="training final JSON")
    s.add_argument("--attempts", help="training attempts JSON (results/train/attempts.json)")
    s.add_argument("--plots-dir", required=True, help="directory with the PNG figures")
    s.add_argument("--out", required=True, help="HTML to write (results/report.html)")
    s.set_defaults(func=cmd_report)

    s = sub.add_parser("compare", help="generalization suite: accuracy per model x batch x method x seed",
                       description="Train every compare.workloads x compare.batches x compare.methods x "
                                   "compare.seeds with compare.nodes workers; write accuracy.csv, a Table-I-like "
                                   "table.md and heatmap.png. Finished runs are reused, so it can be resumed.")  # fmt: skip
    _cfg_arg(s)
    s.add_argument("--out-dir", required=True, help="directory for runs/, accuracy.csv, table.md, heatmap.png")
    s.set_defaults(func=cmd_compare)

    s = sub.add_parser("models", help="list the model names usable as workload.model")
    s.set_defaults(func=cmd_models)

    s = sub.add_parser("check", help="validate a config, its dataset and model, and list the points a search would probe",
                       description="Validate the config; load workload.dataset (files, folders, your callable, a "
                                   "first sample) and build workload.model and run it on a batch of real samples. "
                                   "Every mistake names its config key. Nothing is trained or queued.")  # fmt: skip
    _cfg_arg(s)
    s.add_argument("--config-only", action="store_true", help="only validate the config (no dataset, no model)")
    s.add_argument("--out", help="write the workload's description (samples, classes, shape, parameters) as JSON")
    s.set_defaults(func=cmd_check)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ConfigError, ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"tula {args.stage}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
