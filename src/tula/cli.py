"""``tula <stage>``: one subcommand per arrow of the data flow (see README, "Results files").

    check      config + model + dataset    -> results/workload.json
    memprobe   one worker, a few batches   -> results/memory_probe.json (b_max)
    probe      (N, B)                      -> results/probes/N{n}_B{b}.json
    aggregate  results/probes/*.json       -> results/measurements.csv
    fit        measurements.csv            -> results/model/{memory,perf}.json  (no torch)
    predict    model + grid                -> results/predictions.csv
    select     predictions.csv + objective -> results/selection.json
    plot       selection: csv/json above   -> results/plots/{time,cost,memory,compute}_vs_batch.png
               training: the training job  -> results/plots/training.png
    launch     selection.json              -> results/train/{metrics.csv,final.json,model.pt,attempts.json}
    report     everything above            -> results/report.html
    compare    run: one run of the suite   -> results/compare/runs/<id>/result.json
               aggregate: result.json's    -> results/compare/{accuracy.csv,table.md,heatmap.png}

Each reads files and writes files (atomically), so any stage can be re-run alone or fed
data that did not come from a probe. The Snakemake rule, the subcommand and the module of a
stage share its name (rule memprobe = ``tula memprobe`` = :mod:`tula.stages.memprobe`; a
stage with two steps has a rule per step: plot_selection = ``tula plot selection``). This
module only parses: each stage's module owns the stage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tula.config import ConfigError
from tula.slurm import ClusterUnreadable, PreflightError

EXAMPLES = """examples:
  tula probe --config workflow/config.yaml --workers 2 --global-batch 64 --out results/probes/N2_B64.json
  tula fit --config workflow/config.yaml --measurements results/measurements.csv \
      --memory-out results/model/memory.json --perf-out results/model/perf.json
  tula select --config workflow/config.yaml --predictions results/predictions.csv --out results/selection.json
"""


# Each command imports its stage's module when it runs, so `tula --help` and each stage load
# only what that stage needs (pandas, scipy, matplotlib; torch only in workers).


def _cfg_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, metavar="YAML",
                   help="Tula config (workflow/config.yaml, or the snapshot Snakemake passes); validated on load")  # fmt: skip


def cmd_check(a) -> None:
    from tula.stages import check

    check.run(a.config, a.out, config_only=a.config_only, profile=a.profile, cluster=a.cluster)


def add_check(sub) -> None:
    s = sub.add_parser("check", help="validate a config, its dataset and model, and list the points a search would probe",
                       description="Validate the config; load workload.dataset (files, folders, your callable, a "
                                   "first sample) and build workload.model and run it on a batch of real samples. "
                                   "Every mistake names its config key. Nothing is trained or queued.")  # fmt: skip
    _cfg_arg(s)
    s.add_argument("--config-only", action="store_true", help="only validate the config (no dataset, no model)")
    s.add_argument("--profile", metavar="DIR", help="also read this Snakemake profile (e.g. slurm): its partitions, "
                   "account and the training runtime")
    s.add_argument("--cluster", action="store_true", help="also check, with sinfo/scontrol, that the partition(s) can "
                   "run the memory probe, the probes and training (nodes, CPUs, GPUs per node, time limit)")
    s.add_argument("--out", help="write the workload's description (samples, classes, shape, parameters) as JSON")
    s.set_defaults(func=cmd_check)


def cmd_memprobe(a) -> None:
    from tula.stages import memprobe

    memprobe.run(a.config, a.out)


def add_memprobe(sub) -> None:
    s = sub.add_parser("memprobe", help="measure peak memory at a few local batches on one worker: b_max",
                       description="Run one worker at a few local batches (probe.memory_batches), measure each "
                                   "one's peak memory on real training steps, fit the memory model (Eq. 3) and "
                                   "write b_max, the largest local batch that fits. Runs before any timing probe: "
                                   "the search set never includes a point beyond b_max.")  # fmt: skip
    _cfg_arg(s)
    s.add_argument("--out", required=True, help="JSON to write (results/memory_probe.json)")
    s.set_defaults(func=cmd_memprobe)


def cmd_probe(a) -> None:
    from tula.stages import probe

    probe.run(a.config, a.workers, a.global_batch, a.out, memory_probe=a.memory_probe)


def add_probe(sub) -> None:
    s = sub.add_parser("probe", help="run one short DDP probe at (N, B) and record step time and memory",
                       description="Launch N workers (torchrun locally), time synced and no-sync steps at local batch "
                                   "B/N, count memory (Eq. 3), and write the probe record. A failed probe "
                                   "(oom/error/timeout) is recorded with its status and exits 0.")  # fmt: skip
    _cfg_arg(s)
    s.add_argument("--workers", type=int, required=True, help="N: number of data-parallel workers")
    s.add_argument("--global-batch", type=int, required=True, help="B: global batch size (divisible by N)")
    s.add_argument("--out", required=True, help="probe record to write (results/probes/N{n}_B{b}.json)")
    s.add_argument("--memory-probe", help="results/memory_probe.json: bounds the compute sweep at b_max, and says "
                                          "which smaller batches a partial search falls back to after an OOM")  # fmt: skip
    s.set_defaults(func=cmd_probe)


def cmd_aggregate(a) -> None:
    from tula.stages import aggregate

    aggregate.run(a.probes, a.out, memory_probe=a.memory_probe)


def add_aggregate(sub) -> None:
    s = sub.add_parser("aggregate", help="collect probe records into measurements.csv",
                       description="Collect probe JSON records into one CSV, one row per probe, failed ones included.")  # fmt: skip
    s.add_argument("probes", nargs="+", help="probe JSON files (results/probes/*.json)")
    s.add_argument("--memory-probe", help="results/memory_probe.json: its points become `source = memory` rows")
    s.add_argument("--out", required=True, help="CSV to write (results/measurements.csv)")
    s.set_defaults(func=cmd_aggregate)


def cmd_fit(a) -> None:
    from tula.stages import fit

    fit.run(a.config, a.measurements, a.memory_out, a.perf_out)


def add_fit(sub) -> None:
    s = sub.add_parser("fit", help="fit the memory (Eq. 3) and step-time (Eq. 2) models",
                       description="Fit peak memory linear in local batch (statsmodels WLS), and choose and fit the "
                                   "compute and step forms (scipy, bounded, chosen by held-out error) on the ok rows "
                                   "of a measurements CSV.")  # fmt: skip
    _cfg_arg(s)
    s.add_argument("--measurements", required=True, help="measurements CSV (see docs/results.md for its columns)")
    s.add_argument("--memory-out", required=True, help="memory model JSON to write (results/model/memory.json)")
    s.add_argument("--perf-out", required=True, help="step-time model JSON to write (results/model/perf.json)")
    s.set_defaults(func=cmd_fit)


def cmd_predict(a) -> None:
    from tula.stages import predict

    predict.run(a.config, a.measurements, a.memory, a.perf, a.out, a.train_samples, a.workload)


def add_predict(sub) -> None:
    s = sub.add_parser("predict", help="predict step time, T, C and memory at every grid point",
                       description="Predict every (N, B) of the config's grid, probed or not: step time, training "
                                   "time T (Eq. 4a), cost C (Eq. 4b), memory and feasibility.")  # fmt: skip
    _cfg_arg(s)
    s.add_argument("--measurements", required=True, help="measurements CSV (to mark probed points and OOMs)")
    s.add_argument("--memory", required=True, help="memory model JSON (results/model/memory.json)")
    s.add_argument("--perf", required=True, help="step-time model JSON (results/model/perf.json)")
    s.add_argument("--train-samples", type=int, default=None,
                   help="D, training samples per epoch (default: from the probes, else from --workload)")  # fmt: skip
    s.add_argument("--workload", default=None, help="results/workload.json (tula check's), for D when no probe recorded it")
    s.add_argument("--out", required=True, help="CSV to write (results/predictions.csv)")
    s.set_defaults(func=cmd_predict)


def cmd_select(a) -> None:
    from tula.stages import select

    select.run(a.config, a.predictions, a.out)


def add_select(sub) -> None:
    s = sub.add_parser("select", help="choose (N, B) for the objective: time, cost, knee, time or cost to accuracy",
                       description="Pick the configuration for config key `objective` among feasible points inside "
                                   "`constraints`; write the choice, the runner-up and why.")  # fmt: skip
    _cfg_arg(s)
    s.add_argument("--predictions", required=True, help="predictions CSV from `tula predict`")
    s.add_argument("--out", required=True, help="JSON to write (results/selection.json)")
    s.set_defaults(func=cmd_select)


def cmd_plot(a) -> None:
    from tula.stages import plot

    if a.action == "selection":
        plot.run_selection(a.predictions, a.selection, a.measurements, a.memory, a.perf, a.time_plot, a.cost_plot,
                           a.memory_plot, a.compute_plot)  # fmt: skip
        made = [a.time_plot, a.cost_plot, a.memory_plot, a.compute_plot]
    else:
        plot.run_training(a.metrics, a.final, a.attempts, a.training_plot, a.steps, a.steps_plot)
        made = [a.training_plot, *([a.steps_plot] if a.steps and a.steps_plot else [])]
    print(f"[plot] -> {', '.join(map(str, made))}")


def add_plot(sub) -> None:
    s = sub.add_parser("plot", help="draw the figures: `plot selection` (time/cost/memory/compute vs batch), "
                       "`plot training` (the training curve)")
    steps = s.add_subparsers(dest="action", required=True)
    r = steps.add_parser("selection", help="time, cost, memory and compute vs batch (rule plot_selection)")
    for flag, what in (("--predictions", "predictions CSV"), ("--selection", "selection JSON"),
                       ("--measurements", "measurements CSV"), ("--memory", "memory model JSON"),
                       ("--perf", "step-time model JSON"), ("--time-plot", "PNG to write: training time vs batch"),
                       ("--cost-plot", "PNG to write: cost vs batch"),
                       ("--memory-plot", "PNG to write: memory vs local batch"),
                       ("--compute-plot", "PNG to write: the compute curve (probe and sweep rows, model)")):  # fmt: skip
        r.add_argument(flag, required=True, help=what)
    r = steps.add_parser("training", help="the training curve (rule plot_training)")
    r.add_argument("--metrics", required=True, help="training metrics CSV (results/train/metrics.csv)")
    r.add_argument("--final", required=True, help="training final JSON (results/train/final.json)")
    r.add_argument("--attempts", help="training attempts JSON (results/train/attempts.json): marks relaunches")
    r.add_argument("--training-plot", required=True, help="PNG to write: the training curve")
    r.add_argument("--steps", help="the job's monitored steps (results/train/steps.csv)")
    r.add_argument("--steps-plot", help="PNG to write: step and sync time over the run, with the predicted band")
    s.set_defaults(func=cmd_plot)


def cmd_launch(a) -> None:
    from tula.stages import launch

    launch.run(a.config, a.selection, a.out_dir, predictions=a.predictions, executor_hint=a.executor_hint,
               timeout_min=a.timeout_min, partition=a.slurm_partition or None,
               account=a.slurm_account or None, fresh=a.fresh)  # fmt: skip


def add_launch(sub) -> None:
    s = sub.add_parser("launch", help="submit the production training job at the selected (N, B) and watch it",
                       description="Submit the training job with submitit (SLURM or local processes), echo its "
                                   "progress, requeue it on preemption/timeout from its checkpoint, and relaunch "
                                   "it at the next smaller batch after an out-of-memory error. Writes "
                                   "metrics.csv, final.json, model.pt, attempts.json and checkpoints/.")  # fmt: skip
    _cfg_arg(s)
    s.add_argument("--selection", required=True, help="selection JSON from `tula select`")
    s.add_argument("--out-dir", required=True, help="directory for the training results (results/train)")
    s.add_argument("--predictions", help="predictions CSV: the memory model's order of smaller batches after an OOM")
    _executor_args(s)
    s.add_argument("--fresh", action="store_true", help="ignore existing checkpoints and start over")
    s.set_defaults(func=cmd_launch)


def cmd_report(a) -> None:
    from tula.stages import report

    report.run(a.selection, a.predictions, a.measurements, a.final, a.plots, a.out, attempts=a.attempts, perf=a.perf,
               workload=a.workload)  # fmt: skip


def add_report(sub) -> None:
    s = sub.add_parser("report", help="render results/report.html",
                       description="Render one self-contained HTML page from the results files.")  # fmt: skip
    for flag, what in (("--selection", "selection JSON"), ("--predictions", "predictions CSV"),
                       ("--measurements", "measurements CSV"), ("--final", "training final JSON")):  # fmt: skip
        s.add_argument(flag, required=True, help=what)
    s.add_argument("--attempts", help="training attempts JSON (results/train/attempts.json)")
    s.add_argument("--perf", help="step-time model JSON: the model section (forms, why, residuals)")
    s.add_argument("--workload", help="results/workload.json (tula check): its warnings head the page")
    s.add_argument("--plots", nargs="+", required=True, help="PNG figures to embed")
    s.add_argument("--out", required=True, help="HTML to write (results/report.html)")
    s.set_defaults(func=cmd_report)


def cmd_compare(a) -> None:
    from tula.stages import compare

    if a.action == "run":
        compare.run_one(a.config, a.run, a.out, executor_hint=a.executor_hint, timeout_min=a.timeout_min,
                        partition=a.slurm_partition or None, account=a.slurm_account or None)  # fmt: skip
        return
    compare.aggregate(a.config, a.results, a.csv, a.table, a.heatmap)
    print(f"[compare] -> {a.csv}, {a.table}, {a.heatmap}")
    print(Path(a.table).read_text())


def add_compare(sub) -> None:
    s = sub.add_parser("compare", help="generalization suite (run it with: snakemake --cores 2 compare)",
                       description="The two steps of rules/compare.smk: `run` trains one run of compare.workloads x "
                                   "compare.batches x compare.methods x compare.seeds with compare.workers workers; "
                                   "`aggregate` writes accuracy.csv, a Table-I-like table.md with time to target, "
                                   "and heatmap.png from their result.json files.")  # fmt: skip
    steps = s.add_subparsers(dest="action", required=True)
    r = steps.add_parser("run", help="train one run of the suite (rule compare_run)")
    _cfg_arg(r)
    r.add_argument("--run", required=True, help="run id: <model>__<dataset>__B<batch>__<method>__s<seed>")
    r.add_argument("--out", required=True, help="its result.json (the run's checkpoints, logs, metrics beside it)")
    _executor_args(r)
    r = steps.add_parser("aggregate", help="accuracy.csv, table.md, heatmap.png from result.json files (rule compare)")
    _cfg_arg(r)
    for flag in ("--csv", "--table", "--heatmap"):
        r.add_argument(flag, required=True)
    r.add_argument("results", nargs="+", help="the runs' result.json files")
    s.set_defaults(func=cmd_compare)


def cmd_models(a) -> None:
    from tula.runtime.nets import available  # torch: only for this listing

    for name in available():
        print(name)
    print("tv_<name>: any other torchvision classification model; package.module:callable: your own")


def add_models(sub) -> None:
    s = sub.add_parser("models", help="list the model names usable as workload.model")
    s.set_defaults(func=cmd_models)


def _executor_args(s: argparse.ArgumentParser) -> None:
    """Where `tula launch` (and each run of the suite) submits its job: Snakemake passes these."""
    s.add_argument("--executor-hint", choices=["local", "slurm"],
                   help="what launch.executor: auto means (the rule passes Snakemake's executor)")
    s.add_argument("--timeout-min", type=int, help="job wall time when launch.timeout_min is null (rule runtime)")
    s.add_argument("--slurm-partition", help="partition when launch.slurm_partition is null (profile's)")
    s.add_argument("--slurm-account", help="account when launch.slurm_account is null (profile's)")


STAGES = (add_check, add_memprobe, add_probe, add_aggregate, add_fit, add_predict, add_select, add_plot, add_launch,
          add_report, add_compare, add_models)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tula", description=__doc__, epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = p.add_subparsers(dest="stage", required=True, metavar="STAGE")
    for add in STAGES:
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ConfigError, ValueError, FileNotFoundError, RuntimeError, PreflightError, ClusterUnreadable) as exc:
        print(f"tula {args.stage}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
