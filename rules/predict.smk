rule predict:
    input:
        measurements=rules.aggregate.output[0],
        memory=rules.fit.output.memory,
        perf=rules.fit.output.perf,
        workload=rules.check.output[0],
    output:
        "results/predictions.csv",
    log:
        "results/logs/predict.log",
    # a rule of its own, not a SLURM job (under a module's prefix too: rules/partition.smk)
    localrule: True
    conda:
        CONDA_ENV
    params:
        config=CONFIG,
        settings=settings("predict"),
    shell:
        "tula predict --config {params.config} --measurements {input.measurements}"
        " --memory {input.memory} --perf {input.perf} --workload {input.workload}"
        " --out {output} > {log} 2>&1"
