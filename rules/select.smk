localrules:
    select,


rule select:
    input:
        predictions=rules.predict.output[0],
        measurements=rules.aggregate.output[0],
        perf=rules.fit.output.perf,
        memory=rules.fit.output.memory,
    output:
        "results/selection.json",
    log:
        "results/logs/select.log",
    conda:
        CONDA_ENV
    params:
        config=CONFIG,
        settings=settings("select"),
    shell:
        "tula select --config {params.config} --predictions {input.predictions}"
        " --measurements {input.measurements} --perf {input.perf} --memory {input.memory}"
        " --out {output} > {log} 2>&1"
