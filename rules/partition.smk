# One partition of cluster.partitions, planned as a one-partition config of its own (its GPU,
# nodes, price and name laid over the config: tula.partitions): the workload check, the memory
# probe, the probes, the fits, the predictions, the queue's wait and the choice, every job
# submitted to this partition. The Snakefile uses it once per partition as a module whose
# files lie under results/partitions/<name>/ and whose jobs read
# .snakemake/tula/partitions/<name>.json; `tula combine` (rules/combine.smk) chooses across.
include: "common.smk"
include: "check.smk"
include: "memprobe.smk"
include: "probe.smk"
include: "aggregate.smk"
include: "fit.smk"
include: "predict.smk"
include: "queue.smk"
include: "select.smk"
