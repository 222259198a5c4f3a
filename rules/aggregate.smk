rule aggregate:
    input:
        probes=probe_files,
        memory=rules.memprobe.output,
    output:
        "results/measurements.csv",
    log:
        "results/logs/aggregate.log",
    # a rule of its own, not a SLURM job (under a module's prefix too: rules/partition.smk)
    localrule: True
    conda:
        CONDA_ENV
    shell:
        "tula aggregate {input.probes} --memory-probe {input.memory} --out {output} > {log} 2>&1"
