localrules:
    select,


rule select:
    input:
        rules.predict.output,
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
        "tula select --config {params.config} --predictions {input} --out {output} > {log} 2>&1"
