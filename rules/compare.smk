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
        "../envs/tula.yaml"
    threads: whole_machine
    params:
        config=CONFIG,
        settings=settings("compare"),
    shell:
        "tula compare --config {params.config} --out-dir results/compare > {log} 2>&1"
