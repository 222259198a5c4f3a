rule aggregate:
    input:
        probes=probe_files,
        memory=rules.memprobe.output,
    output:
        "results/partitions/{partition}/measurements.csv",
    log:
        "results/partitions/{partition}/logs/aggregate.log",
    localrule: True
    conda:
        CONDA_ENV
    shell:
        "tula aggregate {input.probes} --memory-probe {input.memory} --out {output} > {log} 2>&1"
