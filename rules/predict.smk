localrules:
    predict,


rule predict:
    input:
        measurements="results/measurements.csv",
        memory="results/model/memory.json",
        perf="results/model/perf.json",
    output:
        "results/predictions.csv",
    log:
        "results/logs/predict.log",
    conda:
        "../envs/tula.yaml"
    params:
        config=CONFIG,
        settings=settings("predict"),
    shell:
        "tula predict --config {params.config} --measurements {input.measurements}"
        " --model-dir results/model --out {output} > {log} 2>&1"
