rule select:
    input:
        predictions=rules.predict.output[0],
        measurements=rules.aggregate.output[0],
        perf=rules.fit.output.perf,
        memory=rules.fit.output.memory,
        # one partition of several (rules/partition.smk): the queue's wait (rules/queue.smk)
        queue=["results/queue.json"] if TULA.cluster.partition else [],
    output:
        "results/selection.json",
    log:
        "results/logs/select.log",
    # a rule of its own, not a SLURM job (under a module's prefix too: rules/partition.smk)
    localrule: True
    conda:
        CONDA_ENV
    params:
        config=CONFIG,
        settings=settings("select"),
        queue=lambda wildcards, input: f"--queue {input.queue}" if input.queue else "",
    shell:
        "tula select --config {params.config} --predictions {input.predictions}"
        " --measurements {input.measurements} --perf {input.perf} --memory {input.memory}"
        " {params.queue} --out {output} > {log} 2>&1"
