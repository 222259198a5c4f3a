localrules:
    aggregate,


rule aggregate:
    input:
        probe_files,
    output:
        "results/measurements.csv",
    log:
        "results/logs/aggregate.log",
    conda:
        "../envs/tula.yaml"
    shell:
        "tula aggregate {input} --out {output} > {log} 2>&1"
