# The production job. `tula launch` submits it itself (submitit: an sbatch job under the SLURM
# profile, local processes otherwise) and watches it, so the rule runs here, never as an
# sbatch inside an sbatch. Its results stay in results/train/.
localrules:
    launch,


rule launch:
    input:
        selection=RESULT["selection"],
        predictions=RESULT["predictions"],
    output:
        metrics="results/train/metrics.csv",
        final="results/train/final.json",
        model="results/train/model.pt",
        attempts="results/train/attempts.json",
        steps="results/train/steps.csv",
    log:
        "results/logs/launch.log",
    benchmark:
        "results/benchmarks/launch.tsv"
    conda:
        CONDA_ENV
    threads: whole_machine
    params:
        config=TRAIN_CONFIG,
        settings=settings("launch"),
        launch=launch_args,
        out_dir=parent_dir("final"),
    shell:
        "tula launch --config {params.config} --selection {input.selection}"
        " --predictions {input.predictions} --out-dir {params.out_dir} {params.launch} > {log} 2>&1"
