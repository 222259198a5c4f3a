rule probe:
    input:
        workload=rules.check.output,
        # b_max for the sweep; a re-run memory probe (a grid change) does not re-buy the probes
        memory=ancient(rules.memprobe.output),
    output:
        # one job per worker count: every batch the search set probes at N, in one process;
        # its records, B{b}.json, beside this list of them
        "results/partitions/{partition}/probes/N{n}/job.json",
    log:
        "results/partitions/{partition}/logs/probe/N{n}.log",
    benchmark:
        "results/partitions/{partition}/benchmarks/probe/N{n}.tsv"
    conda:
        CONDA_ENV
    threads: whole_machine
    resources:
        slurm_partition=site_resource("slurm_partition", "probe"),
        slurm_account=site_resource("slurm_account", "probe"),
        tasks=probe_resource("tasks"),
        nodes=probe_resource("nodes"),
        mpi=probe_resource("mpi"),
        cpus_per_task=probe_resource("cpus_per_task"),
        gres=probe_resource("gres"),
        runtime=probe_resource("runtime"),
        slurm_extra=probe_resource("slurm_extra"),
    params:
        config=part_config,
        settings=settings("probe"),
        batches=probe_job_batches,
    shell:
        "tula probe --config {params.config} --workers {wildcards.n}"
        " --memory-probe {input.memory} --job {output} > {log} 2>&1"
