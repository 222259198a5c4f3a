# The workload check: the dataset loads and the model maps real samples to
# (batch, num_classes). A local rule every probe of its partition depends on, so a wrong model
# or dataset stops the DAG here, before any job is queued.
rule check:
    output:
        "results/partitions/{partition}/workload.json",
    log:
        "results/partitions/{partition}/logs/check.log",
    localrule: True
    conda:
        CONDA_ENV
    params:
        config=part_config,
        settings=settings("check"),
    shell:
        "tula check --config {params.config} --out {output} > {log} 2>&1"
