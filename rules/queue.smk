# One partition's queue (rules/partition.smk): how long each of its grid's job shapes would
# wait now, as SLURM estimates it (`sbatch --test-only`; submits nothing). Objective
# time_to_result adds it to T; the production job asks again when it is submitted. Under the
# local executor there is no queue, and the file says so.
rule queue:
    output:
        "results/queue.json",
    log:
        "results/logs/queue.log",
    # a rule of its own, not a SLURM job (under a module's prefix too: rules/partition.smk)
    localrule: True
    conda:
        CONDA_ENV
    params:
        config=CONFIG,
        settings=settings("select"),
        hint=lambda wildcards: "slurm" if workflow.non_local_exec else "local",
        timeout=lambda wildcards: profile_resource("runtime", "launch") or 1440,
    shell:
        "tula queue --config {params.config} --out {output} --executor-hint {params.hint}"
        " --timeout-min {params.timeout} > {log} 2>&1"
