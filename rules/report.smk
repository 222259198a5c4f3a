localrules:
    report_html,


rule report_html:
    input:
        selection=rules.select.output[0],
        predictions=rules.predict.output[0],
        measurements=rules.aggregate.output[0],
        perf=rules.fit.output.perf,
        final=rules.train.output.final,
        attempts=rules.train.output.attempts,
        plots=list(rules.plot_selection.output) + list(rules.plot_training.output),
    output:
        "results/report.html",
    log:
        "results/logs/report.log",
    conda:
        CONDA_ENV
    shell:
        "tula report --selection {input.selection} --predictions {input.predictions}"
        " --measurements {input.measurements} --perf {input.perf} --final {input.final}"
        " --attempts {input.attempts} --plots {input.plots} --out {output} > {log} 2>&1"
