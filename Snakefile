# Tula: pick (N, B) for data-parallel training, then train there.
# Entry point only; the stages live in rules/*.smk and the logic in src/tula.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "workflow/config.yaml"


# Tula's own loader validates first (rules/common.smk): it names every wrong key in words,
# and Snakemake's validate then checks the config it filled.
include: "rules/common.smk"


validate(config, schema="workflow/config.schema.yaml")


include: "rules/hooks.smk"
# Up to the choice, once per partition ({partition}: the profile's, or each of
# cluster.partitions), under results/partitions/{partition}/; then the choice across them
# (rules/combine.smk), which puts the chosen partition's files in results/.
include: "rules/check.smk"
include: "rules/memprobe.smk"
include: "rules/probe.smk"
include: "rules/aggregate.smk"
include: "rules/fit.smk"
include: "rules/predict.smk"
include: "rules/queue.smk"
include: "rules/select.smk"
include: "rules/combine.smk"
include: "rules/launch.smk"
include: "rules/plot.smk"
include: "rules/report.smk"
include: "rules/compare.smk"
include: "rules/plan.smk"


rule all:
    default_target: True
    input:
        RESULT["selection"],
        rules.plot_selection.output,
        rules.plot_training.output,
        PARTITION_PLOTS,
        rules.launch.output.final,
        rules.report.output,
