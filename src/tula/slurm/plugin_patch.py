"""The one patch Tula lays on snakemake-executor-plugin-slurm: a failed job's nodes are not
excluded from every later submission (:func:`keep_exclusions_to_named_nodes`)."""

from __future__ import annotations


def keep_exclusions_to_named_nodes() -> None:
    """snakemake-executor-plugin-slurm (2.8.0) excludes, after a job ends NODE_FAIL, every node
    sacct lists for it from all later submissions (``--exclude=``). Three things break Tula
    there: a job SLURM requeued lists ``None assigned``, which goes into sbatch's command line
    unquoted, so every later sbatch fails (snakemake/snakemake-executor-plugin-slurm#485); a
    two-node probe's healthy node is excluded with the dead one; and while the dead node is
    down, a two-node job that excludes it asks for more nodes than the partition has, which
    sbatch rejects ("Requested node configuration is not available") where SLURM would
    otherwise hold it until the node is back. SLURM starts no job on a node it marks down or
    drained, so that exclusion adds nothing SLURM does not do already. Until the plugin fixes
    it, each submission excludes only the nodes the user named (its ``exclude_failed_nodes``
    setting), none added after a failure."""
    try:
        import snakemake_executor_plugin_slurm as plugin  # only under the SLURM executor: optional
    except ImportError:
        return
    submit = getattr(plugin, "get_submit_command", None)
    if submit is None or submit.__name__ == "narrowed_submit_command":
        return

    def narrowed_submit_command(job, params, settings=None, failed_nodes=None, **kw):
        named = getattr(settings, "exclude_failed_nodes", None) or ""
        own = {n.strip() for n in named.split(",") if n.strip()}
        return submit(job, params, settings=settings, failed_nodes=own, **kw)

    plugin.get_submit_command = narrowed_submit_command
