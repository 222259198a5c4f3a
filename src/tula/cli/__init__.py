"""``tula <stage>``: one subcommand per arrow of the data flow (see README, "Results files").

    Up to the choice, once per partition, under P = results/partitions/<name>/:
    check      config + model + dataset    -> P/workload.json
    memprobe   one worker, a few batches   -> P/memory_probe.json (b_max)
    probe      N (its batches, one job)    -> P/probes/N{n}/{job,B{b}}.json
    aggregate  P/probes/N*/job.json        -> P/measurements.csv
    fit        measurements.csv            -> P/model/{memory,perf}.json  (no torch)
    predict    model + grid                -> P/predictions.csv
    queue      a partition's job shapes    -> P/queue.json (SLURM's wait)
    select     predictions.csv + objective -> P/selection.json
    combine    each partition's choice     -> results/selection.json and the chosen one's files
    plan       selection.json (no training) -> results/plan/{plan.json,train.sbatch}
    plot       selection: csv/json above   -> results/plots/{time,cost,memory,compute}_vs_batch.png
               training: the training job  -> results/plots/training.png
    launch     selection.json              -> results/train/{metrics,final,model,attempts}.*
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

from tula.cli import partitioning, planning, training
from tula.config import ConfigError
from tula.slurm.controller import ClusterUnreadable
from tula.slurm.partition_info import PreflightError

EXAMPLES = """examples:
  tula probe --config workflow/config.yaml --workers 2 \\
      --memory-probe results/memory_probe.json --job results/probes/N2/job.json
  tula fit --config workflow/config.yaml --measurements results/measurements.csv \\
      --memory-out results/model/memory.json --perf-out results/model/perf.json
  tula select --config workflow/config.yaml --predictions results/predictions.csv \\
      --out results/selection.json
"""

# Each command imports its stage's module when it runs, so `tula --help` and each stage load
# only what that stage needs (pandas, scipy, matplotlib; torch only in workers).
STAGES = (
    planning.add_check,
    planning.add_memprobe,
    planning.add_probe,
    planning.add_aggregate,
    planning.add_fit,
    planning.add_predict,
    planning.add_select,
    partitioning.add_queue,
    partitioning.add_combine,
    planning.add_plan,
    training.add_plot,
    training.add_launch,
    training.add_report,
    training.add_summary,
    training.add_compare,
    training.add_models,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tula",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="stage", required=True, metavar="STAGE")
    for add in STAGES:
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (
        ConfigError,
        ValueError,
        FileNotFoundError,
        RuntimeError,
        PreflightError,
        ClusterUnreadable,
    ) as exc:
        print(f"tula {args.stage}: error: {exc}", file=sys.stderr)
        return 2
    return 0
