# Not part of `rule all` (it trains many models): run it with
#   snakemake --cores 2 compare
rule compare:
    output:
        csv="results/compare/accuracy.csv",
        table="results/compare/table.md",
        heatmap=report(
            "results/compare/heatmap.png",
            caption="../workflow/report/compare.rst",
            category="Generalization",
        ),
    log:
        "results/logs/compare.log",
    benchmark:
        "results/benchmarks/compare.tsv"
    conda:
        CONDA_ENV
    threads: whole_machine
    params:
        config=CONFIG,
        settings=settings("compare"),
        out_dir=parent_dir("csv"),
    shell:
        "tula compare --config {params.config} --out-dir {params.out_dir} > {log} 2>&1"
