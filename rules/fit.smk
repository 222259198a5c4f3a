rule fit:
    input:
        rules.aggregate.output,
    output:
        memory="results/model/memory.json",
        perf="results/model/perf.json",
    log:
        "results/logs/fit.log",
    # a rule of its own, not a SLURM job (under a module's prefix too: rules/partition.smk)
    localrule: True
    conda:
        CONDA_ENV
    params:
        config=CONFIG,
        settings=settings("fit"),
    shell:
        "tula fit --config {params.config} --measurements {input}"
        " --memory-out {output.memory} --perf-out {output.perf} > {log} 2>&1"
