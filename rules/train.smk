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
    resources:
        tasks=train_resource("tasks"),
        nodes=train_resource("nodes"),
        mpi=train_resource("mpi"),
        cpus_per_task=train_resource("cpus_per_task"),
        gres=train_resource("gres"),
    params:
        config=CONFIG,
        settings=settings("train"),
    shell:
        "tula train --config {params.config} --selection {input} --out-dir results/train > {log} 2>&1"
