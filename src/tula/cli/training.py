"""`tula` subcommands of what follows the plan: plot, launch, report, compare, models. Each
imports its stage's module when it runs."""

from __future__ import annotations

from pathlib import Path

from tula.cli.args import cfg_arg, executor_args

# Each command imports its stage's module when it runs, so `tula --help` and each stage load
# only what that stage needs (pandas, scipy, matplotlib; torch only in workers).


def cmd_plot(a) -> None:
    from tula.stages import plot

    if a.action == "selection":
        plot.run_selection(
            a.predictions,
            a.selection,
            a.measurements,
            a.memory,
            a.perf,
            a.time_plot,
            a.cost_plot,
            a.memory_plot,
            a.compute_plot,
        )
        made = [a.time_plot, a.cost_plot, a.memory_plot, a.compute_plot]
    elif a.action == "partitions":
        from tula.stages.plot import partitions

        partitions.run(a.predictions, a.selection, a.out)
        made = [a.out]
    else:
        plot.run_training(a.metrics, a.final, a.attempts, a.training_plot, a.steps, a.steps_plot)
        made = [a.training_plot, *([a.steps_plot] if a.steps and a.steps_plot else [])]
    print(f"[plot] -> {', '.join(map(str, made))}")


def add_plot(sub) -> None:
    s = sub.add_parser(
        "plot",
        help="draw the figures: `plot selection` (time/cost/memory/compute vs batch), "
        "`plot training` (the training curve)",
    )
    steps = s.add_subparsers(dest="action", required=True)
    r = steps.add_parser(
        "selection", help="time, cost, memory and compute vs batch (rule plot_selection)"
    )
    for flag, what in (
        ("--predictions", "predictions CSV"),
        ("--selection", "selection JSON"),
        ("--measurements", "measurements CSV"),
        ("--memory", "memory model JSON"),
        ("--perf", "step-time model JSON"),
        ("--time-plot", "PNG to write: training time vs batch"),
        ("--cost-plot", "PNG to write: cost vs batch"),
        ("--memory-plot", "PNG to write: memory vs local batch"),
        ("--compute-plot", "PNG to write: the compute curve (probe and sweep rows, model)"),
    ):
        r.add_argument(flag, required=True, help=what)
    r = steps.add_parser(
        "partitions", help="every partition's time-cost Pareto front (rule plot_partitions)"
    )
    r.add_argument(
        "--predictions", required=True, help="results/partitions/predictions.csv (tula combine)"
    )
    r.add_argument("--selection", required=True, help="selection JSON across partitions")
    r.add_argument("--out", required=True, help="PNG to write")
    r = steps.add_parser("training", help="the training curve (rule plot_training)")
    r.add_argument(
        "--metrics", required=True, help="training metrics CSV (results/train/metrics.csv)"
    )
    r.add_argument("--final", required=True, help="training final JSON (results/train/final.json)")
    r.add_argument(
        "--attempts", help="training attempts JSON (results/train/attempts.json): marks relaunches"
    )
    r.add_argument("--training-plot", required=True, help="PNG to write: the training curve")
    r.add_argument("--steps", help="the job's monitored steps (results/train/steps.csv)")
    r.add_argument(
        "--steps-plot",
        help="PNG to write: step and sync time over the run, with the predicted band",
    )
    s.set_defaults(func=cmd_plot)


def cmd_launch(a) -> None:
    from tula.stages import launch

    launch.run(
        a.config,
        a.selection,
        a.out_dir,
        predictions=a.predictions,
        executor_hint=a.executor_hint,
        timeout_min=a.timeout_min,
        partition=a.slurm_partition or None,
        account=a.slurm_account or None,
        fresh=a.fresh,
    )


def add_launch(sub) -> None:
    s = sub.add_parser(
        "launch",
        help="submit the production training job at the selected (N, B) and watch it",
        description="Submit the training job with submitit (SLURM or local processes), echo its "
        "progress, requeue it on preemption/timeout from its checkpoint, and relaunch it at the "
        "next smaller batch after an out-of-memory error. Writes metrics.csv, final.json, "
        "model.pt, attempts.json and checkpoints/.",
    )
    cfg_arg(s)
    s.add_argument("--selection", required=True, help="selection JSON from `tula select`")
    s.add_argument(
        "--out-dir", required=True, help="directory for the training results (results/train)"
    )
    s.add_argument(
        "--predictions",
        help="predictions CSV: the memory model's order of smaller batches after an OOM",
    )
    executor_args(s)
    s.add_argument(
        "--fresh", action="store_true", help="ignore existing checkpoints and start over"
    )
    s.set_defaults(func=cmd_launch)


def cmd_report(a) -> None:
    from tula.stages import report

    report.run(
        a.selection,
        a.predictions,
        a.measurements,
        a.final,
        a.plots,
        a.out,
        attempts=a.attempts,
        perf=a.perf,
        workload=a.workload,
        memory_probe=a.memory_probe,
        plan=a.plan,
    )


def cmd_summary(a) -> None:
    from tula import config as config_mod
    from tula.stages import summary

    lines = summary.success_lines(a.results, config_mod.load(a.config))
    if not lines:
        raise FileNotFoundError(f"{a.results}/selection.json: no run to summarise")
    print("\n".join(lines))


def add_summary(sub) -> None:
    s = sub.add_parser(
        "summary",
        help="print a finished run's answer (what Snakemake prints at its end)",
        description="The chosen (N, B) and why, what the production job paid against the "
        "prediction, the accuracy, what not to trust and the report's path, from the results "
        "files.",
    )
    cfg_arg(s)
    s.add_argument("--results", default="results", help="the results directory")
    s.set_defaults(func=cmd_summary)


def add_report(sub) -> None:
    s = sub.add_parser(
        "report",
        help="render results/report.html",
        description="Render one self-contained HTML page from the results files.",
    )
    for flag, what in (
        ("--selection", "selection JSON"),
        ("--predictions", "predictions CSV"),
        ("--measurements", "measurements CSV"),
    ):
        s.add_argument(flag, required=True, help=what)
    s.add_argument(
        "--final", help="training final JSON; without it (snakemake plan) no training ran"
    )
    s.add_argument("--plan", help="results/plan/plan.json: the plan's files, named on the page")
    s.add_argument("--attempts", help="training attempts JSON (results/train/attempts.json)")
    s.add_argument("--perf", help="step-time model JSON: the model section (forms, why, residuals)")
    s.add_argument(
        "--workload", help="results/workload.json (tula check): its warnings head the page"
    )
    s.add_argument(
        "--memory-probe",
        help="results/memory_probe.json: how far the estimate from the model alone held",
    )
    s.add_argument("--plots", nargs="+", required=True, help="PNG figures to embed")
    s.add_argument("--out", required=True, help="HTML to write (results/report.html)")
    s.set_defaults(func=cmd_report)


def cmd_compare(a) -> None:
    from tula.stages.compare import collect, train

    if a.action == "run":
        train.run_one(
            a.config,
            a.run,
            a.out,
            executor_hint=a.executor_hint,
            timeout_min=a.timeout_min,
            partition=a.slurm_partition or None,
            account=a.slurm_account or None,
        )
        return
    collect.aggregate(a.config, a.results, a.csv, a.table, a.heatmap)
    print(f"[compare] -> {a.csv}, {a.table}, {a.heatmap}")
    print(Path(a.table).read_text())


def add_compare(sub) -> None:
    s = sub.add_parser(
        "compare",
        help="generalization suite (run it with: snakemake --cores 2 compare)",
        description="The two steps of rules/compare.smk: `run` "
        "trains one run of compare.workloads x compare.batches x compare.methods x compare.seeds "
        "with compare.workers workers; `aggregate` writes accuracy.csv, a Table-I-like table.md "
        "with time to target, and heatmap.png from their result.json files.",
    )
    steps = s.add_subparsers(dest="action", required=True)
    r = steps.add_parser("run", help="train one run of the suite (rule compare_run)")
    cfg_arg(r)
    r.add_argument(
        "--run", required=True, help="run id: <model>__<dataset>__B<batch>__<method>__s<seed>"
    )
    r.add_argument(
        "--out",
        required=True,
        help="its result.json (the run's checkpoints, logs, metrics beside it)",
    )
    executor_args(r)
    r = steps.add_parser(
        "aggregate",
        help="accuracy.csv, table.md, heatmap.png from result.json files (rule compare)",
    )
    cfg_arg(r)
    for flag in ("--csv", "--table", "--heatmap"):
        r.add_argument(flag, required=True)
    r.add_argument("results", nargs="+", help="the runs' result.json files")
    s.set_defaults(func=cmd_compare)


def cmd_models(a) -> None:
    from tula.runtime.step.nets import available  # torch: only for this listing

    for name in available():
        print(name)
    print(
        "tv_<name>: any other torchvision classification model; package.module:callable: your own"
    )


def add_models(sub) -> None:
    s = sub.add_parser("models", help="list the model names usable as workload.model")
    s.set_defaults(func=cmd_models)
