rule probe:
    input:
        workload=rules.check.output,
        # b_max for the sweep; a re-run memory probe (a grid change) does not re-buy the probes
        memory=ancient(rules.memprobe.output),
    output:
        "results/probes/N{n}_B{b}.json",
    log:
        "results/logs/probe/N{n}_B{b}.log",
    benchmark:
        "results/benchmarks/probe/N{n}_B{b}.tsv"
    conda:
        CONDA_ENV
    threads: whole_machine
    resources:
        tasks=probe_resource("tasks"),
        nodes=probe_resource("nodes"),
        mpi=probe_resource("mpi"),
        cpus_per_task=probe_resource("cpus_per_task"),
        gres=probe_resource("gres"),
        runtime=probe_resource("runtime"),
        slurm_extra=probe_resource("slurm_extra"),
    params:
        config=CONFIG,
        settings=settings("probe"),
    shell:
        "tula probe --config {params.config} --workers {wildcards.n} --global-batch {wildcards.b}"
        " --memory-probe {input.memory} --out {output} > {log} 2>&1"
