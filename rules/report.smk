localrules:
    report_html,


rule report_html:
    input:
        selection="results/selection.json",
        predictions="results/predictions.csv",
        measurements="results/measurements.csv",
        final="results/train/final.json",
        attempts="results/train/attempts.json",
        plots=SELECTION_PLOTS + ["results/plots/training.png"],
    output:
        "results/report.html",
    log:
        "results/logs/report.log",
    conda:
        "../envs/tula.yaml"
    shell:
        "tula report --selection {input.selection} --predictions {input.predictions}"
        " --measurements {input.measurements} --final {input.final} --attempts {input.attempts}"
        " --plots-dir results/plots --out {output} > {log} 2>&1"
