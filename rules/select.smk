# A partition's own choice, with the queue's wait (rules/queue.smk); `tula combine`
# (rules/combine.smk) chooses across the partitions' choices.
rule select:
    input:
        predictions=rules.predict.output[0],
        measurements=rules.aggregate.output[0],
        perf=rules.fit.output.perf,
        memory=rules.fit.output.memory,
        queue=rules.queue.output[0],
    output:
        "results/partitions/{partition}/selection.json",
    log:
        "results/partitions/{partition}/logs/select.log",
    localrule: True
    conda:
        CONDA_ENV
    params:
        config=part_config,
        settings=settings("select"),
    shell:
        "tula select --config {params.config} --predictions {input.predictions}"
        " --measurements {input.measurements} --perf {input.perf} --memory {input.memory}"
        " --queue {input.queue} --out {output} > {log} 2>&1"
