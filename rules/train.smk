rule train:
    input:
        "results/selection.json",
    output:
        metrics="results/train/metrics.csv",
        final="results/train/final.json",
    log:
        "results/logs/train.log",
    benchmark:
        "results/benchmarks/train.tsv"
    conda:
        "../envs/tula.yaml"
    threads: whole_machine
    params:
        config=CONFIG,
        settings=settings("train"),
    shell:
        "tula train --config {params.config} --selection {input} --out-dir results/train > {log} 2>&1"
