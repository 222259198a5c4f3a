localrules:
    report,


rule report:
    input:
        selection=rules.select.output[0],
        predictions=rules.predict.output[0],
        measurements=rules.aggregate.output[0],
        perf=rules.fit.output.perf,
        workload=rules.check.output[0],
        memory=rules.memprobe.output[0],
        final=rules.launch.output.final,
        attempts=rules.launch.output.attempts,
        plots=list(rules.plot_selection.output) + list(rules.plot_training.output),
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
