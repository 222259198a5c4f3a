# The memory probe: one worker, a few local batches, seconds. A checkpoint: which timing
# probes run is decided from its result (b_max), so no probe is spent on a point the
# memory model already rules out. `snakemake -n` lists it and the jobs that wait on it.
checkpoint memprobe:
    input:
        rules.check.output,
    output:
        "results/memory_probe.json",
    log:
        "results/logs/memprobe.log",
    benchmark:
        "results/benchmarks/memprobe.tsv"
    conda:
        CONDA_ENV
    threads: whole_machine
    resources:
        **PARTITION_RESOURCES,
        tasks=1,
        nodes=1,
        cpus_per_task=TULA.hardware.threads_per_worker,
        gres=memprobe_gres,
        runtime=PROBE_RUNTIME_MIN,
    params:
        config=CONFIG,
        settings=settings("memprobe"),
    shell:
        "tula memprobe --config {params.config} --workload {input} --out {output} > {log} 2>&1"
