rule predict:
    input:
        measurements=rules.aggregate.output[0],
        memory=rules.fit.output.memory,
        perf=rules.fit.output.perf,
        workload=rules.check.output[0],
    output:
        "results/partitions/{partition}/predictions.csv",
    log:
        "results/partitions/{partition}/logs/predict.log",
    localrule: True
    conda:
        CONDA_ENV
    params:
        config=part_config,
        settings=settings("predict"),
    shell:
        "tula predict --config {params.config} --measurements {input.measurements}"
        " --memory {input.memory} --perf {input.perf} --workload {input.workload}"
        " --out {output} > {log} 2>&1"
