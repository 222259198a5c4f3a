localrules:
    report,


rule report:
    input:
        selection=RESULT["selection"],
        predictions=RESULT["predictions"],
        measurements=RESULT["measurements"],
        perf=RESULT["perf"],
        workload=RESULT["workload"],
        memory=RESULT["memory_probe"],
        final=rules.launch.output.final,
        attempts=rules.launch.output.attempts,
        plots=list(rules.plot_selection.output)
        + list(rules.plot_training.output)
        + PARTITION_PLOTS,
    output:
        "results/report.html",
    log:
        "results/logs/report.log",
    conda:
        CONDA_ENV
    shell:
        "tula report --selection {input.selection} --predictions {input.predictions}"
        " --measurements {input.measurements} --perf {input.perf} --workload {input.workload}"
        " --memory-probe {input.memory}"
        " --final {input.final}"
        " --attempts {input.attempts} --plots {input.plots} --out {output} > {log} 2>&1"
