"""``tula check``: everything that can be known before a job is queued.

- the config validates (every key, its bounds, the checks a schema cannot express) and the
  dataset's files are where it says;
- the search set that a probe campaign will run is listed;
- with ``--profile``, the Snakemake profile is read (partitions, account, training runtime);
  with ``--cluster``, the grid's jobs are checked against the SLURM partitions
  (:func:`tula.preflight.preflight`);
- where the jobs run (:func:`tula.devices.for_config`: ``hardware.device: auto`` decided from
  this machine's GPUs, or with ``--cluster`` the partition's), said in one line; ``cuda`` with
  fewer GPUs than the grid needs is refused here, naming ``grid.workers``;
- unless ``--config-only``, the dataset loads and the model maps a batch of real samples to
  (batch, num_classes) (:func:`tula.runtime.step.nets.check_workload`), and the workload's
  description is written (``results/workload.json``).
"""

from __future__ import annotations

from typing import Any

from tula import config as config_mod
from tula import devices, model_inputs, partitions, preflight
from tula.dataset_paths import check_dataset_paths
from tula.io import write_json
from tula.model import estimated
from tula.model.grid import batches_at, boundary_workers, grid, search_set
from tula.model.memory import probe_batches
from tula.pipeline import snapshot
from tula.slurm import shapes
from tula.stages.check import script as script_check


def _cluster_side(cfg: config_mod.Config, prof: dict, profile: str | None, cluster: bool) -> None:
    """What the profile says (``profile``), and whether the partitions can run the grid's
    jobs (``cluster``: scontrol/sinfo)."""
    if profile:
        print(
            f"profile {profile}: valid; executor {prof['executor']}, probes on partition "
            f"{prof['probe_partition'] or '(cluster default)'}, training on "
            f"{cfg.launch.slurm_partition or prof['train_partition'] or '(cluster default)'} "
            f"for {cfg.launch.timeout_min or prof['train_runtime_min'] or 1440} min"
        )
    if cluster:  # each partition of the table, its probes and training where they go
        preflight.each_partition(
            partitions.table(cfg.to_dict(), prof),
            prof,
            describe_to=print,
            train_runtime_min=cfg.launch.timeout_min or prof.get("train_runtime_min") or 1440,
            profile_mem_mb=prof.get("mem_mb"),
            probe_points=len(batches_at(model_inputs.grid_spec(cfg), max(cfg.grid.workers))),
        )


def _as_the_jobs_read_it(
    cfg: config_mod.Config, prof: dict, cluster: bool, resolved: str | None
) -> tuple[config_mod.Config, devices.Decision]:
    """The config resolved as the workflow's jobs read it (the device decided; the memory
    budget was decided when it loaded), said, and written to ``resolved`` when asked."""
    decision = devices.for_config(cfg, "slurm" if cluster else "local", prof.get("probe_partition"))
    print(f"device: {decision.why}")
    cfg = devices.apply(cfg, decision)
    print(f"memory budget: {cfg.hardware.describe_memory()}")
    if resolved:
        snapshot(cfg, resolved)
    return cfg, decision


def run(
    config,
    out=None,
    config_only: bool = False,
    profile: str | None = None,
    cluster: bool = False,
    resolved: str | None = None,
) -> dict | None:
    """``tula check``: validate the config, list the search set; with ``profile``, read the
    Snakemake profile; with ``cluster``, check the grid's jobs against the SLURM partitions
    (tula.slurm); unless ``config_only``, load the dataset and run the model on real
    samples, and write the workload's description. ``resolved``: write the config as the
    jobs read it (:func:`tula.pipeline.snapshot`, what the workflow's onstart writes)."""
    cfg = config_mod.load(config)
    check_dataset_paths(cfg)
    g = model_inputs.grid_spec(cfg)
    pts = search_set(g)
    print(
        f"{config}: valid. {len(grid(g))} grid points; {cfg.search} search probes up to "
        f"{len(pts)} (fewer where the memory probe's b_max rules points out): "
        + ", ".join(p.name for p in pts)
    )
    edge = boundary_workers(model_inputs.grid_spec(cfg))
    if edge and cfg.search == "partial":
        print(
            "the grid crosses a node boundary "
            f"(cluster.workers_per_node={cfg.cluster.workers_per_node}): partial search also "
            f"probes N={edge[0]} (the largest on one node) and N={edge[1]} (the smallest on "
            "several), so the sync model sees both sides of it"
        )
    print(describe_campaign(campaign(cfg)))
    prof = preflight.read_profile(profile) if profile else {}
    cfg, decision = _as_the_jobs_read_it(cfg, prof, cluster, resolved)
    _cluster_side(cfg, prof, profile, cluster)
    if config_only or cfg.workload.script:  # a script is run here, not built: its own check
        return _script_workload(cfg, decision, out) if not config_only else None
    from tula.runtime.step.nets import check_workload  # torch: only when the workload is checked

    w = check_workload(cfg)
    print(
        f"workload: {w['dataset']}: {w['train_samples']} training / {w['test_samples']} test "
        f"samples of shape {tuple(w['input_shape'])}, {w['num_classes']} classes; model "
        f"{w['model']}: {w['parameters']:,} parameters, forward on a sample batch ok"
    )
    print(describe_training(w["training"]))
    upsampling = image_size_warning(cfg, w.get("stored_image_size"))
    if upsampling:
        print(upsampling)
    # a named GPU: the jobs' device, whatever this (login) node has
    w["estimate"] = estimate(cfg, w, "cuda" if cfg.hardware.gpu else decision.device)
    if out:
        device = {
            "device": decision.device,
            "backend": decision.backend,
            "why": decision.why,
            "memory_budget_bytes": cfg.hardware.memory_budget_bytes,
            "memory_budget": cfg.hardware.describe_memory(),
        }
        write_json(out, {**w, "device": device, "warnings": [upsampling] if upsampling else []})
    return w


def _script_workload(cfg: config_mod.Config, decision: devices.Decision, out) -> dict:
    """The user's own script, run here for a few steps (:mod:`tula.stages.check.script`):
    results/workload.json says what it did; no estimate from the model alone (Tula never
    builds the script's model)."""
    rec = script_check.run(cfg)
    print(script_check.describe(rec, str(cfg.workload.script)))
    for line in rec["warnings"]:
        print(line)
    w = {
        "workload": "script",
        "script": cfg.workload.script,
        "args": list(cfg.workload.args),
        "model": "(the script's own)",
        "dataset": "(the script's own)",
        "train_samples": rec.get("train_samples"),
        "num_classes": None,
        "check": rec,
        "estimate": None,
    }
    if out:
        device = {"device": decision.device, "backend": decision.backend, "why": decision.why}
        write_json(out, {**w, "device": device, "warnings": rec["warnings"]})
    return w


def describe_training(t: dict[str, Any]) -> str:
    """The way of training the probes time and production runs, in one line."""
    args = ", ".join(f"{k}={v}" for k, v in t["optimizer_args"].items())
    warm = f"{t['warmup_epochs']:g}-epoch linear warm-up, then " if t["warmup_epochs"] else ""
    smooth = f", label smoothing {t['label_smoothing']:g}" if t["label_smoothing"] else ""
    return (
        f"training: {t['optimizer']}({args}), {warm}{t['schedule']} LR schedule, loss "
        f"{t['loss']}{smooth}, metric {t['metric']} ({t['metric_goal']}); built and run on "
        f"real samples; method {t['method']} ({t['method_reason']})"
    )


def estimate(cfg: config_mod.Config, w: dict, device: str) -> dict | None:
    """The step's memory and FLOPs from the model alone (:mod:`tula.runtime.probe.estimate`) at the
    memory probe's smallest and largest local batch, and what they say of the grid
    (:func:`print_plan`). None, said, when the model cannot run without data: the memory probe
    measures it all the same."""
    # torch: only when the workload itself is checked
    from tula.runtime.probe.estimate import estimate_step

    bs = probe_batches(model_inputs.grid_spec(cfg), model_inputs.probe_steps(cfg).memory_batches)
    lo, hi = bs[0], bs[-1] if bs[-1] > bs[0] else 2 * bs[0]
    try:
        est = estimate_step(cfg, w["input_shape"], w["num_classes"], (lo, hi), device).to_dict()
    except RuntimeError as exc:
        print(f"estimate: none ({exc}); the memory probe will measure the step")
        return None
    est["resident_bytes"] = resident_set(cfg, w, device)
    est["fixed_bytes"] += est["resident_bytes"]
    print_plan(cfg, est)
    return est


def resident_set(cfg: config_mod.Config, w: dict, device: str) -> int:
    """The training set's bytes the jobs keep on the device beside the step (data.on_device,
    :func:`tula.runtime.input.loader.resident_by_rule` on the memory budget): the memory probe
    measures with it there, so the estimate's fixed part holds it too (0 where it stays on the
    host). Without the set, the H200's ResNet-50 estimate was under the memory probe at
    b = 32 (BENCHMARKS.md "Memory")."""
    # torch: only when the workload is checked
    from tula.runtime.input.loader import resident_by_rule

    nbytes = w.get("train_bytes")
    budget = cfg.hardware.memory_budget_bytes
    kept = device == "cuda" and resident_by_rule(cfg.data.on_device, device, nbytes, budget)
    return int(nbytes) if kept and nbytes else 0


def print_plan(cfg: config_mod.Config, est: dict) -> None:
    """What the estimate says before anything is queued: the step's memory and FLOPs, b_max per
    N after the margin, the points it rules out, and with hardware.gpu each point's roofline
    compute time and the campaign's price range."""
    mib = 2**20
    print(
        f"estimate (the step under FakeTensorMode, {est['seconds']:.1f} s, for {est['device']}, "
        f"{cfg.train.precision}): memory per worker = {est['fixed_bytes'] / mib:.1f} MiB + "
        f"{est['per_sample_bytes'] / mib:.2f} MiB x local batch; "
        f"{est['flops_per_sample'] / 1e9:.3g} GFLOP per sample (forward + backward)"
    )
    if est.get("resident_bytes"):
        print(
            f"  the fixed part holds the training set kept on the GPU "
            f"({est['resident_bytes'] / mib:.1f} MiB as stored; data.on_device)"
        )
    budget = cfg.hardware.memory_budget_bytes
    gpu = cfg.hardware.gpu
    where = (gpu if isinstance(gpu, str) else "the GPU given") if gpu else "the device"
    if budget is not None:
        bmax = estimated.max_local_batch(est, budget)
        print(
            f"on {where} ({budget / 1e9:.1f} GB per worker after hardware.memory_margin): "
            f"b_max = {bmax} per worker, so "
            + ", ".join(f"N={n}: B <= {n * bmax}" for n in cfg.grid.workers)
        )
    g, dev = model_inputs.grid_spec(cfg), model_inputs.device(cfg)
    rows = estimated.grid_estimate(dev, est, [(p.workers, p.global_batch) for p in grid(g)])
    out = [r for r in rows if r["ruled_out"]]
    if out:
        print(
            f"over the budget by more than {estimated.CLEAR_MARGIN:.0%} in one batch by the "
            "estimate ("
            + (
                "train.accumulate: auto runs them as micro-batches that fit): "
                if g.accumulate == "auto"
                else "not probed): "
            )
            + ", ".join(
                f"N={r['workers']} B={r['global_batch']} ({r['estimate_bytes'] / 1e9:.1f} GB)"
                for r in out
            )
        )
    if gpu:
        print("roofline, the least compute time of a step (ms):")
        for n in cfg.grid.workers:
            print(
                f"  N={n}: "
                + ", ".join(
                    f"B={r['global_batch']} {1e3 * r['roofline_s']:.3g}"
                    for r in rows
                    if r["workers"] == n
                )
            )
    pts = search_set(g, estimated.clear_bound(est, budget))
    if out:
        print(f"so the campaign probes at most {len(pts)}: {', '.join(p.name for p in pts)}")
    if gpu:
        print_campaign_price(cfg, est, pts)


def print_campaign_price(cfg: config_mod.Config, est: dict, pts: list) -> None:
    """The probe campaign's price range on the named GPU (:func:`estimated.campaign_price`)."""
    jobs = [{"workers": p.workers, "local_batch": p.local_batch} for p in pts]
    steps, rate = model_inputs.probe_steps(cfg), model_inputs.price(cfg)
    price = estimated.campaign_price(model_inputs.device(cfg), steps, rate, est, jobs)
    print(
        f"probe campaign's price: {price['low']:.3g} to {price['high']:.3g} "
        f"{price['currency']} ({len(jobs)} probes in {len({p.workers for p in pts})} jobs: at "
        "least their timed steps at the roofline, at most each at its time limit)"
    )


def campaign(cfg: config_mod.Config, max_local_batch: int | None = None) -> dict[str, Any]:
    """What the probe campaign buys before it runs: the memory probe and one probe job per
    worker count of the search set (before the memory probe, b_max unknown: the most it can
    be), each job's batches, measured in turn in one process, and nodes
    (:func:`tula.slurm.shapes.job_shape`), and the node-hours if every job ran to its time limit
    (probe.timeout_s for each of its batches, and 5 min): an upper bound."""
    points = search_set(model_inputs.grid_spec(cfg), max_local_batch)
    jobs = [{"job": "memory probe", "workers": 1, "nodes": shapes.job_shape(cfg, 1).nodes}]
    jobs[0]["hours_max"] = preflight.probe_runtime_min(cfg) / 60
    for n in sorted({p.workers for p in points}):
        batches = [p.global_batch for p in points if p.workers == n]
        jobs.append(
            {
                "job": f"N{n}",
                "workers": n,
                "nodes": shapes.job_shape(cfg, n).nodes,
                "batches": batches,
                "hours_max": preflight.probe_runtime_min(cfg, len(batches)) / 60,
            }
        )
    return {
        "jobs": jobs,
        "probe_jobs": len(jobs) - 1,
        "points": len(points),
        "node_jobs": sum(j["nodes"] for j in jobs),
        "node_hours_max": sum(j["nodes"] * j["hours_max"] for j in jobs),
        "hours_per_job_max": max(j["hours_max"] for j in jobs),
        "exclusive": cfg.probe.exclusive,
    }


def describe_campaign(c: dict[str, Any]) -> str:
    by_nodes: dict[int, list[str]] = {}
    for j in c["jobs"][1:]:
        by_nodes.setdefault(j["nodes"], []).append(
            f"{j['job']}: B {', '.join(map(str, j['batches']))}"
        )
    per = "; ".join(
        f"{len(names)} on {n} node(s) ({'; '.join(names)})" for n, names in sorted(by_nodes.items())
    )
    return (
        f"probe campaign: the memory probe (1 node) and {c['probe_jobs']} probe job(s), one per "
        f"N, {c['points']} point(s) in all: {per}; {c['node_jobs']} node-jobs of at most "
        f"{60 * c['hours_per_job_max']:.0f} min"
        f"{' (whole nodes: probe.exclusive)' if c['exclusive'] else ''}, at most "
        f"{c['node_hours_max']:.1f} node-hours (every job at its time limit)"
    )


# data.image_size above this many times an image folder's stored side is worth a warning
UPSAMPLE_WARN = 1.25


def image_size_warning(cfg: config_mod.Config, stored: tuple[int, int] | list[int] | None) -> str:
    """A warning when ``data.image_size`` upsamples the images an image folder stores: every
    probe and training step then pays for pixels that were never there (24 px images at the
    default 224 are ~87x the pixels)."""
    if not stored or not cfg.workload.dataset.startswith("imagefolder:"):
        return ""
    side = cfg.data.image_size
    if side <= UPSAMPLE_WARN * max(stored):
        return ""
    w, h = stored
    factor = side * side / (w * h)
    return (
        f"warning: config key 'data.image_size' is {side}, but the images of "
        f"{cfg.workload.dataset} are {w}x{h} px: each is upsampled to {side}x{side}, {factor:.0f}x "
        "its pixels, and every probe and training step pays for them. Unless the model needs that "
        f"input size, set data.image_size: {max(w, h)} (and data.resize, if set)"
    )
