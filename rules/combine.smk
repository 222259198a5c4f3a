# Several partitions (cluster.partitions): each is planned by rules/partition.smk as a module
# of its own -- its rules named <partition>_<rule>, its files under
# results/partitions/<name>/, its jobs reading .snakemake/tula/partitions/<name>.json and
# submitted to that partition -- and `tula combine` chooses across them. The stages after the
# choice (plot, report, plan, launch) read the chosen partition's files where a one-partition
# run writes them (tula.stages.combine).
import re

for _name, _raw in PARTITIONS.items():
    PART_MODULE = f"partition_{_name}"
    PART_RULES = re.sub(r"\W", "_", _name) + "_"

    module:
        name: PART_MODULE
        snakefile:
            "partition.smk"
        config:
            _raw
        replace_prefix:
            {"results/": f"{tula_partitions.results_dir(_name)}/"}

    use rule * from PART_MODULE as PART_RULES*


localrules:
    combine,


rule combine:
    input:
        expand(
            "{dir}/{file}",
            dir=[tula_partitions.results_dir(n) for n in PARTITIONS],
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
        parts=" ".join(
            f"--part {n}={tula_partitions.results_dir(n)}" for n in PARTITIONS
        ),
        snapshots=tula_partitions.SNAPSHOT_DIR,
    shell:
        "tula combine --config {params.config} {params.parts} --snapshots {params.snapshots}"
        " --out-dir results > {log} 2>&1"


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
