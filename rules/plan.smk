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
        selection=rules.select.output[0],
        predictions=rules.predict.output[0],
        workload=rules.check.output[0],
    output:
        plan="results/plan/plan.json",
        sbatch="results/plan/train.sbatch",
    log:
        "results/logs/plan.log",
    conda:
        CONDA_ENV
    params:
        config=CONFIG,
        settings=settings("launch"),
        job=plan_args,
        out_dir=parent_dir("plan"),
    shell:
        "tula plan --config {params.config} --selection {input.selection}"
        " --predictions {input.predictions} --workload {input.workload}"
        " --out-dir {params.out_dir} {params.job} > {log} 2>&1"


rule report_plan:
    input:
        selection=rules.select.output[0],
        predictions=rules.predict.output[0],
        measurements=rules.aggregate.output[0],
        perf=rules.fit.output.perf,
        workload=rules.check.output[0],
        memory=rules.memprobe.output[0],
        plan=rules.plan_files.output.plan,
        plots=list(rules.plot_selection.output),
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
        rules.select.output,
        rules.plot_selection.output,
        rules.plan_files.output,
        rules.report_plan.output,
