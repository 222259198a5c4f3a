localrules:
    fit,


rule fit:
    input:
        "results/measurements.csv",
    output:
        "results/model/memory.json",
        "results/model/perf.json",
    log:
        "results/logs/fit.log",
    conda:
        "../envs/tula.yaml"
    params:
        config=CONFIG,
        settings=settings("fit"),
    shell:
        "tula fit --config {params.config} --measurements {input} --out-dir results/model > {log} 2>&1"
