# `tula launch` submits the training job itself (submitit: an sbatch job under the SLURM
# profile, local processes otherwise) and watches it, so the rule runs here, never as an
# sbatch inside an sbatch.
localrules:
    train,


rule train:
    input:
        selection=rules.select.output[0],
        predictions=rules.predict.output[0],
    output:
        metrics="results/train/metrics.csv",
        final="results/train/final.json",
        model="results/train/model.pt",
        attempts="results/train/attempts.json",
    log:
        "results/logs/train.log",
    benchmark:
        "results/benchmarks/train.tsv"
    conda:
        CONDA_ENV
    threads: whole_machine
    params:
        config=CONFIG,
        settings=settings("train"),
        launch=launch_args,
        out_dir=parent_dir("final"),
    shell:
        "tula launch --config {params.config} --selection {input.selection}"
        " --predictions {input.predictions} --out-dir {params.out_dir} {params.launch} > {log} 2>&1"
