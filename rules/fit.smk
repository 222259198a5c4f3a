rule fit:
    input:
        rules.aggregate.output,
    output:
        memory="results/partitions/{partition}/model/memory.json",
        perf="results/partitions/{partition}/model/perf.json",
    log:
        "results/partitions/{partition}/logs/fit.log",
    localrule: True
    conda:
        CONDA_ENV
    params:
        config=part_config,
        settings=settings("fit"),
    shell:
        "tula fit --config {params.config} --measurements {input}"
        " --memory-out {output.memory} --perf-out {output.perf} > {log} 2>&1"
