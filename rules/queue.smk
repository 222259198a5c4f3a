# A partition's queue: how long each of its grid's production job shapes would wait now, as SLURM
# estimates it (`sbatch --test-only`; submits nothing). Objective time_to_result adds it to T;
# the production job asks again when it is submitted. Under the local executor, or with no
# partition named (the profile's, unset), there is no queue, and the file says so.
rule queue:
    output:
        "results/partitions/{partition}/queue.json",
    log:
        "results/partitions/{partition}/logs/queue.log",
    localrule: True
    conda:
        CONDA_ENV
    params:
        config=part_config,
        settings=settings("select"),
        hint=lambda wildcards: "slurm" if workflow.non_local_exec else "local",
        timeout=lambda wildcards: profile_resource("runtime", "launch") or 1440,
        partition=lambda wildcards: TABLE[wildcards.partition].train_partition(PROFILE)
        or "",
    shell:
        "tula queue --config {params.config} --out {output} --executor-hint {params.hint}"
        " --timeout-min {params.timeout} --partition '{params.partition}' > {log} 2>&1"
