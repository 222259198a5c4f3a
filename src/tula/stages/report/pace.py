"""The report's sections on what sets the step's pace besides the model and the network: the
input pipeline (and the decoder ``data.decode: auto`` measured faster) and the host, where the
device waits for Python; each says what would help."""

from __future__ import annotations

import html

import pandas as pd

from tula.model.measurements import HOST_BOUND, INPUT_BOUND, host_bound


def input_section(
    predictions: pd.DataFrame, measurements: pd.DataFrame, chosen: tuple[int, int]
) -> str:
    """Where the input pipeline, not the model or the network, sets the pace, and what would
    lift it; one line where it was timed and nowhere close."""
    if "input_time_s" not in predictions.columns or predictions["input_time_s"].isna().all():
        return ""
    share = predictions["input_time_s"] / predictions["step_time_s"]
    bound = predictions[predictions["input_bound"].astype(bool)]
    if bound.empty:
        return (
            f"<p><b>Input</b>: the input pipeline read alone takes at most {100 * share.max():.2g} "
            "% of a predicted step at any grid point: it does not set the pace.</p>"
        )
    points = ", ".join(f"N={int(r.workers)} B={int(r.global_batch)}" for r in bound.itertuples())
    workers = sorted(
        {
            int(w)
            for w in pd.to_numeric(
                measurements.get("data_workers", pd.Series(dtype=float)), errors="coerce"
            ).dropna()
        }
    )
    here = any((int(r.workers), int(r.global_batch)) == chosen for r in bound.itertuples())
    return (
        "<div class='card bad'><b>The input sets the pace</b> at "
        + html.escape(points)
        + " (the input "
        f"pipeline alone takes at least {100 * INPUT_BOUND:.0f} % of the step there"
        + ("; the selected point is one of them" if here else "")
        + "). A faster model, a faster network or more workers "
        "per batch would not make those steps faster. What would: more loader processes per worker "
        "(data.num_workers"
        + (f", the probes read with {', '.join(map(str, workers))}" if workers else "")
        + "), more CPU cores per "
        "worker (SLURM's --cpus-per-task, or fewer workers per node: each node's loaders share its "
        "cores), or lighter decoding (smaller stored images, data.image_size).</div>"
    )


def decode_line(measurements: pd.DataFrame) -> str:
    """data.decode auto, where the probes measured both decoders: which they kept, and by how
    much it was faster (each probe's own measurement)."""
    if "decode" not in measurements.columns:
        return ""
    rows = measurements[measurements["decode"].isin(["cpu", "gpu"])]
    if rows.empty:
        return ""
    where = {"cpu": "on the CPU (loader workers)", "gpu": "on the GPU (nvJPEG)"}
    kept = rows["decode"].value_counts()
    faster = pd.to_numeric(rows["decode_faster_by"], errors="coerce")
    first = kept.index[0]
    split = (
        f" ({', '.join(f'{n} probe(s) {where[k]}' for k, n in kept.items())}: the two were close)"
        if len(kept) > 1
        else ""
    )
    return (
        f"<p><b>Decoding</b> (data.decode: auto): the probes timed both decoders and read "
        f"{where[first]}, {faster.min():.2f}-{faster.max():.2f}x faster than the other{split}; "
        "the production job measures the same way at its start. Set data.decode to cpu or gpu "
        "to fix it.</p>"
    )


def host_section(measurements: pd.DataFrame) -> str:
    """Where the host, not the device, sets the pace: on a device with a queue (CUDA) the
    probes that spent at least HOST_BOUND of the step queuing it (the GPU waited for Python),
    and what would help. Nothing where no probe could tell (a CPU has no queue)."""
    if "step_host_share" not in measurements.columns:
        return ""
    ok = measurements[(measurements["source"] == "probe") & (measurements["status"] == "ok")]
    share = pd.to_numeric(ok["step_host_share"], errors="coerce")
    ok, share = ok[share.notna()], share[share.notna()]
    if ok.empty:
        return ""
    bound = host_bound(share)
    if not bound.any():
        return (
            f"<p><b>Host</b>: queuing a step took at most {100 * share.max():.0f} % of its time "
            "on the device at any probe: the device, not Python, sets the pace.</p>"
        )
    batches = ok["global_batch"].astype(int)
    top = int(batches[bound].max())
    free_above = batches[~bound & (batches > top)]
    where = (
        f"below B = {int(free_above.min())}"
        if len(free_above)
        else f"at every batch probed up to B = {top}"
    )
    points = ", ".join(
        f"N={int(r.workers)} B={int(r.global_batch)} ({100 * sh:.0f} %)"
        for r, sh in zip(ok[bound].itertuples(), share[bound])
    )
    return (
        f"<div class='card bad'><b>The host sets the pace {where}: the GPU waits for Python.</b> "
        f"Queuing a step took at least {100 * HOST_BOUND:.0f} % of its time on the device at "
        f"{html.escape(points)}. A faster GPU, or more of them, would not make those steps "
        "faster. What would: <code>train.compile: true</code> (fewer, fused kernels to queue "
        "per step), a larger batch per worker (more work for each step's queuing), or a faster "
        "host CPU.</div>"
    )
