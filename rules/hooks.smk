# What runs once before the first job, and never in a dry run, `--lint` or a job's own
# Snakemake: the config snapshot the jobs read and, under the SLURM executor, the price of the
# probe campaign and the preflight (can the partitions run the memory probe, the probes and
# training? tula.slurm; `tula check --cluster` alike).


onstart:
    tula_pipeline.snapshot(decided(), CONFIG)
    for name, raw in PARTITIONS.items():  # each partition's jobs read their own
        tula_pipeline.snapshot(
            decide(tula_config.from_dict(raw)), tula_partitions.snapshot_path(name)
        )
    if workflow.non_local_exec:
        tula_plugin_patch.keep_exclusions_to_named_nodes()  # the plugin's failed-node exclusion
        for line in campaign_lines():
            print(line, flush=True)
        profile = profile_settings()
        try:
            if PARTITIONS:  # every listed partition, its probes and training on it
                tula_preflight.each_partition(
                    {
                        n: tula_config.from_dict(raw)
                        for n, raw in PARTITIONS.items()
                    },
                    describe_to=lambda said: print(
                        f"tula preflight: {said}", flush=True
                    ),
                    train_runtime_min=TULA.launch.timeout_min
                    or profile["train_runtime_min"],
                    profile_mem_mb=profile["mem_mb"],
                    probe_points=len(batches_at(TULA_GRID, max(TULA.grid.workers))),
                )
            else:
                report = tula_preflight.preflight(
                    TULA,
                    probe_partition=profile["probe_partition"],
                    train_partition=TULA.launch.slurm_partition
                    or profile["train_partition"],
                    train_runtime_min=TULA.launch.timeout_min
                    or profile["train_runtime_min"],
                    profile_mem_mb=profile["mem_mb"],
                    probe_points=len(batches_at(TULA_GRID, max(TULA.grid.workers))),
                )
                print(
                    f"tula preflight: {tula_preflight.describe(report)}", flush=True
                )
        except tula_preflight.ClusterUnreadable as err:
            print(f"tula preflight skipped: {err}", flush=True)
        except tula_preflight.PreflightError as err:
            raise WorkflowError(
                f"{err}\n(see workflow/config.yaml and the profile)"
            )


# The answer where the user looks (tula.stages.summary): at the end of a run, the choice and
# why, what the production job paid against the prediction, the accuracy, what not to trust
# and the report's path; after a failure, the failing rule's log and its last error line.
onsuccess:
    for line in tula_summary.success_lines("results", TULA):
        print(line, flush=True)


onerror:
    for line in tula_summary.error_lines(log):
        print(line, flush=True)
