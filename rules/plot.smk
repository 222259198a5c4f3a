localrules:
    plot_selection,
    plot_training,


rule plot_selection:
    input:
        predictions=RESULT["predictions"],
        selection=RESULT["selection"],
        measurements=RESULT["measurements"],
        memory=RESULT["memory"],
        perf=RESULT["perf"],
    output:
        time=report(
            "results/plots/time_vs_batch.png",
            caption="../workflow/report/time_vs_batch.rst",
            category="Selection",
        ),
        cost=report(
            "results/plots/cost_vs_batch.png",
            caption="../workflow/report/cost_vs_batch.rst",
            category="Selection",
        ),
        memory=report(
            "results/plots/memory_vs_batch.png",
            caption="../workflow/report/memory_vs_batch.rst",
            category="Selection",
        ),
        compute=report(
            "results/plots/compute_vs_batch.png",
            caption="../workflow/report/compute_vs_batch.rst",
            category="Selection",
        ),
    log:
        "results/logs/plot_selection.log",
    conda:
        CONDA_ENV
    shell:
        "tula plot selection --predictions {input.predictions} --selection {input.selection}"
        " --measurements {input.measurements} --memory {input.memory} --perf {input.perf}"
        " --time-plot {output.time} --cost-plot {output.cost} --memory-plot {output.memory}"
        " --compute-plot {output.compute} > {log} 2>&1"


rule plot_training:
    input:
        metrics=rules.launch.output.metrics,
        final=rules.launch.output.final,
        attempts=rules.launch.output.attempts,
        steps=rules.launch.output.steps,
    output:
        training=report(
            "results/plots/training.png",
            caption="../workflow/report/training.rst",
            category="Training",
        ),
        steps=report(
            "results/plots/steps.png",
            caption="../workflow/report/steps.rst",
            category="Training",
        ),
    log:
        "results/logs/plot_training.log",
    conda:
        CONDA_ENV
    shell:
        "tula plot training --metrics {input.metrics} --final {input.final}"
        " --attempts {input.attempts} --training-plot {output.training}"
        " --steps {input.steps} --steps-plot {output.steps} > {log} 2>&1"
