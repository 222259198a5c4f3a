# The memory probe: one worker, a few local batches, seconds. A checkpoint: which timing
# probes run is decided from its result (b_max), so no probe is spent on a point the
# memory model already rules out. `snakemake -n` lists it and the jobs that wait on it.
checkpoint memprobe:
    input:
        rules.check.output,
    output:
        "results/partitions/{partition}/memory_probe.json",
    log:
        "results/partitions/{partition}/logs/memprobe.log",
    benchmark:
        "results/partitions/{partition}/benchmarks/memprobe.tsv"
    conda:
        CONDA_ENV
    threads: whole_machine
    resources:
        slurm_partition=site_resource("slurm_partition", "memprobe"),
        slurm_account=site_resource("slurm_account", "memprobe"),
        tasks=1,
        nodes=1,
        cpus_per_task=memprobe_resource("cpus_per_task"),
        gres=memprobe_resource("gres"),
        runtime=memprobe_resource("runtime"),
    params:
        config=part_config,
        settings=settings("memprobe"),
    shell:
        "tula memprobe --config {params.config} --workload {input} --out {output} > {log} 2>&1"
