localrules:
    plot_selection,
    plot_training,


rule plot_selection:
    input:
        predictions="results/predictions.csv",
        selection="results/selection.json",
        measurements="results/measurements.csv",
        memory="results/model/memory.json",
    output:
        report(
            "results/plots/time_vs_batch.png",
            caption="../workflow/report/time_vs_batch.rst",
            category="Selection",
        ),
        report(
            "results/plots/cost_vs_batch.png",
            caption="../workflow/report/cost_vs_batch.rst",
            category="Selection",
        ),
        report(
            "results/plots/memory_vs_batch.png",
            caption="../workflow/report/memory_vs_batch.rst",
            category="Selection",
        ),
    log:
        "results/logs/plot_selection.log",
    conda:
        "../envs/tula.yaml"
    shell:
        "tula plot --predictions {input.predictions} --selection {input.selection}"
        " --measurements {input.measurements} --model-dir results/model"
        " --out-dir results/plots > {log} 2>&1"


rule plot_training:
    input:
        metrics="results/train/metrics.csv",
        final="results/train/final.json",
        attempts="results/train/attempts.json",
    output:
        report(
            "results/plots/training.png",
            caption="../workflow/report/training.rst",
            category="Training",
        ),
    log:
        "results/logs/plot_training.log",
    conda:
        "../envs/tula.yaml"
    shell:
        "tula plot --metrics {input.metrics} --final {input.final}"
        " --attempts {input.attempts} --out-dir results/plots > {log} 2>&1"
