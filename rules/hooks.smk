# What runs once before the first job, and never in a dry run, `--lint` or a job's own
# Snakemake: the config snapshot the jobs read and, under the SLURM executor, the price of the
# probe campaign and the preflight (can the partitions run the memory probe, the probes and
# training? tula.slurm; `tula check --cluster` alike).


onstart:
    tula_pipeline.snapshot(decided(), CONFIG)
    for name in TABLE:  # each partition's jobs read their own
        tula_pipeline.snapshot(
            decided_in(name), tula_partitions.snapshot_path(name)
        )
    for line in stale_lines():
        print(line, flush=True)
    if workflow.non_local_exec:
        tula_plugin_patch.keep_exclusions_to_named_nodes()  # the plugin's failed-node exclusion
        for line in campaign_lines():
            print(line, flush=True)
        try:  # every partition, its probes and its training where they go
            tula_preflight.each_partition(
                TABLE,
                PROFILE,
                describe_to=lambda said: print(
                    f"tula preflight: {said}", flush=True
                ),
                train_runtime_min=TULA.launch.timeout_min
                or PROFILE["train_runtime_min"],
                profile_mem_mb=PROFILE["mem_mb"],
                probe_points=len(
                    batches_at(
                        tula_model_inputs.grid_spec(TULA), max(TULA.grid.workers)
                    )
                ),
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
