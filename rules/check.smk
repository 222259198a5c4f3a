# The workload check: the dataset loads and the model maps real samples to
# (batch, num_classes). A local rule every probe depends on, so a wrong model or dataset
# stops the DAG here, before any job is queued.
rule check:
    output:
        "results/workload.json",
    log:
        "results/logs/check.log",
    # a rule of its own, not a SLURM job (under a module's prefix too: rules/partition.smk)
    localrule: True
    conda:
        CONDA_ENV
    params:
        config=CONFIG,
        settings=settings("check"),
    shell:
        "tula check --config {params.config} --out {output} > {log} 2>&1"
