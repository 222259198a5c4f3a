# The plan alone (`snakemake plan`): everything up to the choice and the report, and no
# training. `tula plan` writes the answer to take to your own training script: plan.json
# and a SLURM batch script (train.sbatch) with the production job's shape. The report says
# no training ran, and names them.
localrules:
    plan_files,
    report_plan,
    plan,


rule plan_files:
    input:
        selection=RESULT["selection"],
        predictions=RESULT["predictions"],
        workload=RESULT["workload"],
    output:
        plan="results/plan/plan.json",
        sbatch="results/plan/train.sbatch",
    log:
        "results/logs/plan.log",
    conda:
        CONDA_ENV
    params:
        config=TRAIN_CONFIG,
        settings=settings("launch"),
        job=plan_args,
        out_dir=parent_dir("plan"),
    shell:
        "tula plan --config {params.config} --selection {input.selection}"
        " --predictions {input.predictions} --workload {input.workload}"
        " --out-dir {params.out_dir} {params.job} > {log} 2>&1"


rule report_plan:
    input:
        selection=RESULT["selection"],
        predictions=RESULT["predictions"],
        measurements=RESULT["measurements"],
        perf=RESULT["perf"],
        workload=RESULT["workload"],
        memory=RESULT["memory_probe"],
        plan=rules.plan_files.output.plan,
        plots=list(rules.plot_selection.output) + PARTITION_PLOTS,
    output:
        "results/plan/report.html",
    log:
        "results/logs/report_plan.log",
    conda:
        CONDA_ENV
    shell:
        "tula report --selection {input.selection} --predictions {input.predictions}"
        " --measurements {input.measurements} --perf {input.perf} --workload {input.workload}"
        " --memory-probe {input.memory} --plan {input.plan}"
        " --plots {input.plots} --out {output} > {log} 2>&1"


rule plan:
    input:
        RESULT["selection"],
        rules.plot_selection.output,
        rules.plan_files.output,
        rules.report_plan.output,
