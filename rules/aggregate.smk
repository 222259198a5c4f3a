localrules:
    aggregate,


rule aggregate:
    input:
        probes=probe_files,
        memory=rules.memprobe.output,
    output:
        "results/measurements.csv",
    log:
        "results/logs/aggregate.log",
    conda:
        CONDA_ENV
    shell:
        "tula aggregate {input.probes} --memory-probe {input.memory} --out {output} > {log} 2>&1"
