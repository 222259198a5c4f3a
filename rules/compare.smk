# The generalization suite (tula.stages.compare), a fan-out that is not part of `rule all` (it
# trains many models):
#   snakemake --cores 8 compare            # runs in parallel on this machine
#   snakemake --profile slurm compare      # every run its own SLURM job
# One compare_run job per (workload, B, method, seed); `compare` aggregates them.
# Like train, each run's `tula compare run` submits its own job (submitit: an sbatch job
# under the SLURM profile, requeued from its checkpoints; local processes otherwise) and
# watches it, so the rule runs here.
localrules:
    compare_run,
    compare,


rule compare_run:
    output:
        "results/compare/runs/{run}/result.json",
    log:
        "results/logs/compare/{run}.log",
    benchmark:
        "results/benchmarks/compare/{run}.tsv"
    wildcard_constraints:
        run=r"[^/]+",
    conda:
        CONDA_ENV
    threads: compare_threads
    params:
        config=CONFIG,
        settings=settings("compare_run"),
        launch=launch_args,
    shell:
        "tula compare run --config {params.config} --run {wildcards.run} --out {output}"
        " {params.launch} > {log} 2>&1"


rule compare:
    input:
        expand(rules.compare_run.output[0], run=COMPARE_RUNS),
    output:
        csv="results/compare/accuracy.csv",
        table="results/compare/table.md",
        heatmap=report(
            "results/compare/heatmap.png",
            caption="../workflow/report/compare.rst",
            category="Generalization",
        ),
    log:
        "results/logs/compare.log",
    conda:
        CONDA_ENV
    params:
        config=CONFIG,
        settings=settings("compare"),
    shell:
        "tula compare aggregate --config {params.config} --csv {output.csv} --table {output.table}"
        " --heatmap {output.heatmap} {input} > {log} 2>&1"
