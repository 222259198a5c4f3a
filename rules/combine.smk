# The choice across the partitions of the table (rules/common.smk; one partition: its own
# choice), and the chosen partition's files put where the stages after the choice (plot,
# report, plan, launch) and the user read them: results/selection.json, predictions.csv,
# measurements.csv, model/, workload.json, memory_probe.json, and its config at
# results/partitions/chosen.json (tula.stages.combine). One rule, one partition or many.
localrules:
    combine,


rule combine:
    input:
        expand(
            "{dir}/{file}",
            dir=[tula_partitions.results_dir(n) for n in TABLE],
            file=("selection.json", *tula_combine.CHOSEN_FILES),
        ),
    output:
        selection=RESULT["selection"],
        spanning="results/partitions/predictions.csv",
        config="results/partitions/chosen.json",
        chosen=[f"results/{f}" for f in tula_combine.CHOSEN_FILES],
    log:
        "results/logs/combine.log",
    conda:
        CONDA_ENV
    params:
        config=CONFIG,
        settings=settings("select"),
        parts=" ".join(f"--part {n}={tula_partitions.results_dir(n)}" for n in TABLE),
        snapshots=tula_partitions.SNAPSHOT_DIR,
    shell:
        "tula combine --config {params.config} {params.parts} --snapshots {params.snapshots}"
        " --out-dir results > {log} 2>&1"


# every partition's Pareto front, when there are two or more (PARTITION_PLOTS)
localrules:
    plot_partitions,


rule plot_partitions:
    input:
        predictions=rules.combine.output.spanning,
        selection=rules.combine.output.selection,
    output:
        report(
            "results/plots/partitions.png",
            caption="../workflow/report/partitions.rst",
            category="Selection",
        ),
    log:
        "results/logs/plot_partitions.log",
    conda:
        CONDA_ENV
    shell:
        "tula plot partitions --predictions {input.predictions} --selection {input.selection}"
        " --out {output} > {log} 2>&1"
