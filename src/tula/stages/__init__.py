"""The pipeline's stages, one module per Snakemake rule and ``tula`` subcommand (rule = verb =
module): check, memprobe, probe, aggregate, fit, predict, select, plot, report, launch,
compare. Each reads files and writes files; none imports torch when it is imported (the
workers that need torch are in :mod:`tula.runtime`)."""
