"""Tula's training step against a plain PyTorch loop, side by side in one process: is
Tula's step fast and steady on the GPU?

For each global batch B (one worker), at the same model, precision and memory format:

  plain eager      DDP of one, SGD (momentum, weight decay), autocast, data already on the
                   device: the loop a user writes by hand (../shared/gpu/plain_bench.py's step)
  plain compiled   the same under torch.compile
  tula probe       Replica.walk.next_steps under the probe's timer (the train.method step, its
                   loader feed, AGS's on-device test), eager and with train.compile: on
  tula production  Replica.walk.run_step over a stretch with one synchronisation at its end, as
                   the production job's Trainer runs it, eager and compiled

Each variant: warm-up steps, then the probe's own timer (tula.runtime.timer.timing.StepTimer): on
CUDA blocks between CUDA events sized so that their one synchronisation costs under 1 %, on CPU each
step alone, until the mean is within --target (95 % half-width, 2 %) or --budget seconds are
spent; the step is the mean, beside its median, the samples' CV and the precision reached.
Then host reads: every method's 10 steady-state steps under
torch.cuda.set_sync_debug_mode("error") (a synchronising call raises), and the first-step costs
the probe records.

    python bench/gpu_step.py --device cuda --model tv_resnet50 --size 224 \
        --batches 32,64,128,256,512,1024
    python bench/gpu_step.py --device cpu   # this 2-core machine (small_cnn, 8 px)

Prints one row per (B, variant) and writes --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tula import config as config_mod
from tula.runtime.group import dist
from tula.runtime.step.nets import build_model
from tula.runtime.step.replica import Replica
from tula.runtime.timer.clocks import clock_for
from tula.runtime.timer.timing import StepTimer, Target

METHODS = ("ags", "lbt", "lrs", "static", "lars", "polo")


def make_npz(path: Path, n: int, size: int, channels: int = 3) -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, size=(n, channels, size, size), dtype=np.uint8)
    y = rng.integers(0, 10, size=n)
    xt = x[: max(n // 8, 64)]
    np.savez(path, x_train=x, y_train=y, x_test=xt, y_test=y[: len(xt)])


def tula_config(a, npz: Path, method: str = "ags", compile_on: bool = False) -> config_mod.Config:
    raw = {
        "workload": {"model": a.model, "dataset": f"npz:{npz}", "epochs": 1},
        "grid": {"workers": [1], "batch_min": min(a.batches), "batch_max": max(a.batches)},
        "hardware": {
            "device": a.device,
            "device_memory_gb": a.memory_gb,
            "threads_per_worker": a.threads,
        },
        "train": {
            "method": method,
            "precision": a.precision,
            "channels_last": a.device == "cuda",
            "compile": "on" if compile_on else "off",
            "lr": 0.1,
        },
        "data": {"eval_batch_size": 256},
    }
    return config_mod.from_dict(raw, source="bench/gpu_step.py")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def blocks(run, device, a) -> dict:
    """``run(k)`` runs up to k steps untimed and returns (steps, kind). Timed by the probe's own
    timer (:class:`tula.runtime.timer.timing.StepTimer`): on CUDA blocks between CUDA events, sized
    so that their one synchronisation costs under 1 % (``--block`` forces a size), on CPU every step
    alone; until the mean is within ``--target`` (95 % half-width) after ``--min-steps``, or
    ``--budget`` seconds. Steps other than plain ones (an epoch's first) are set apart."""
    run(a.warm)
    sync(device)
    timer = StepTimer(
        clock_for(device, lambda: sync(device)),
        Target(a.target, a.min_steps, a.budget),
        block_steps=a.block,
    )
    t = timer.run({"step": run})
    s = t.arms["step"]
    return {
        "step_s": s.mean(),
        "median_s": statistics.median(s.times),
        "cv": statistics.pstdev(s.times) / statistics.fmean(s.times),
        "halfwidth_rel": s.half_width(),
        "reached": t.reached,
        "block": t.block_steps,
        "steps": s.n_steps,
        "timing_s": t.elapsed_s,
        "blocks": s.times,
    }


def plain(a, device, B: int, compiled: bool) -> dict:
    torch.manual_seed(0)
    model = build_model(a.model, (3, a.size, a.size), 10).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    net = torch.compile(ddp) if compiled else ddp
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(B, 3, a.size, a.size, device=device)
    if device.type == "cuda":
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (B,), device=device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)

    def steps(k: int) -> tuple[int, str]:
        for _ in range(k):
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = torch.nn.functional.cross_entropy(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return k, "plain"

    t0 = time.perf_counter()
    steps(1)
    sync(device)
    first = time.perf_counter() - t0
    out = blocks(steps, device, a)
    out["first_step_s"] = first
    return out


def tula(
    a, device, npz: Path, B: int, compiled: bool, production: bool, method: str = "ags"
) -> dict:
    cfg = tula_config(a, npz, method, compiled)
    r = Replica(cfg, device, B, 0, 1)
    t0 = time.perf_counter()
    r.walk.next_timed_step()  # the first step at this shape (an epoch's first: AGS's refresh too)
    first = time.perf_counter() - t0

    def production_stretch(k: int) -> tuple[int, str]:  # Trainer.train_epoch: steps queued
        n = min(k, r.walk.plain_steps_ahead())
        if n < 1:  # an epoch's start or its short last batch: the trainer times those apart
            return r.walk.next_steps(1)
        batches = r.stream.current(r.walk.pos)
        for _ in range(n):
            r.walk.run_step(batches)
        return n, "plain"

    # the probe: Replica.walk.next_steps under the probe's timer; production: the trainer's stretch
    out = blocks(production_stretch if production else r.walk.next_steps, device, a)
    out["first_step_s"] = first
    r = None  # the replica (and its device memory) goes before the next point
    return out


def host_reads(a, device, npz: Path, B: int) -> dict:
    """Each method's 10 steady-state steps with CUDA's sync debug mode on "error"."""
    # nothing to synchronise with: tests/runtime/test_host_reads.py counts reads on CPU
    if device.type != "cuda":
        return {m: "not checked on CPU (see tests/runtime/test_host_reads.py)" for m in METHODS}
    res = {}
    for method in METHODS:
        r = Replica(tula_config(a, npz, method), device, B, 0, 1)
        r.walk.next_timed_step()
        r.walk.next_timed_step()
        batches = r.stream.current(r.walk.pos)
        sync(device)
        try:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("error")
            for _ in range(min(10, r.walk.plain_steps_ahead())):
                r.walk.run_step(batches)
            res[method] = "0 synchronising calls"
        except RuntimeError as exc:
            res[method] = f"synchronised: {str(exc).splitlines()[0][:160]}"
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode(0)
        sync(device)
        del r
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default=None)
    ap.add_argument("--size", type=int, default=None)
    ap.add_argument("--batches", default=None)
    ap.add_argument("--compile-batches", default=None, help="batches timed compiled (default: all)")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--precision", default=None)
    ap.add_argument("--memory-gb", type=float, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument(
        "--block", type=int, default=None, help="steps per block (CUDA; default: sized)"
    )
    ap.add_argument("--target", type=float, default=0.02, help="precision: 95 %% half-width")
    ap.add_argument("--min-steps", type=int, default=20)
    ap.add_argument("--budget", type=float, default=30.0, help="seconds of timing per variant")
    ap.add_argument(
        "--variants",
        default="plain,tula_probe,tula_production,plain_compiled,tula_probe_compiled,"
        "tula_production_compiled",
    )
    ap.add_argument("--no-host-reads", action="store_true")
    ap.add_argument("--out", default="gpu_step.json")
    a = ap.parse_args()
    gpu = a.device == "cuda"
    a.model = a.model or ("tv_resnet50" if gpu else "small_cnn")
    a.size = a.size or (224 if gpu else 8)
    a.precision = a.precision or ("bf16" if gpu else "fp32")
    a.memory_gb = a.memory_gb if a.memory_gb is not None else (80 if gpu else None)
    a.batches = [
        int(b) for b in (a.batches or ("32,64,128,256,512,1024" if gpu else "32,64,128")).split(",")
    ]
    comp = [int(b) for b in a.compile_batches.split(",")] if a.compile_batches else a.batches
    # whole blocks between an epoch's start and end
    a.samples = a.samples or max(a.batches) * 13
    os.environ.update(
        {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29561"}
    )
    tmp = Path(tempfile.mkdtemp())
    npz = tmp / "data.npz"
    make_npz(npz, a.samples, a.size)
    _, device, backend = dist.init(tula_config(a, npz).hardware)
    name = torch.cuda.get_device_name(device) if gpu else "cpu"
    print(
        f"device {name}, backend {backend}, torch {torch.__version__}, {a.model} {a.size}px "
        f"{a.precision}, {a.samples} samples",
        flush=True,
    )
    result = {
        "device": name,
        "torch": torch.__version__,
        "model": a.model,
        "size": a.size,
        "precision": a.precision,
        "block": a.block,
        "target": a.target,
        "budget_s": a.budget,
        "rows": [],
    }
    runners = {
        "plain": lambda B: plain(a, device, B, False),
        "plain_compiled": lambda B: plain(a, device, B, True),
        "tula_probe": lambda B: tula(a, device, npz, B, False, False),
        "tula_production": lambda B: tula(a, device, npz, B, False, True),
        "tula_probe_compiled": lambda B: tula(a, device, npz, B, True, False),
        "tula_production_compiled": lambda B: tula(a, device, npz, B, True, True),
    }
    for B in a.batches:
        base = {}
        for v in a.variants.split(","):
            if "compiled" in v and B not in comp:
                continue
            t0 = time.perf_counter()
            try:
                r = runners[v](B)
            except torch.OutOfMemoryError:
                print(f"B={B} {v}: out of memory", flush=True)
                torch.cuda.empty_cache()
                continue
            base[v] = r["step_s"]
            ref = base.get("plain_compiled" if "compiled" in v else "plain")
            ratio = r["step_s"] / ref if ref else None
            row = {
                "batch": B,
                "variant": v,
                **r,
                "images_per_s": B / r["step_s"],
                "ratio_to_plain": ratio,
                "wall_s": time.perf_counter() - t0,
            }
            result["rows"].append(row)
            print(
                f"B={B:5d} {v:26s} {1e3 * r['step_s']:8.2f} ms  {B / r['step_s']:8.0f} img/s  CV "
                f"{100 * r['cv']:5.2f} %  +-{100 * r['halfwidth_rel']:.2f} % "
                f"({'reached' if r['reached'] else 'missed'}, {r['steps']} steps, block "
                f"{r['block']})  first {r['first_step_s']:.2f} s"
                + (f"  x{ratio:.3f} of plain" if ratio else ""),
                flush=True,
            )
            if gpu:
                torch.cuda.empty_cache()
        Path(a.out).write_text(json.dumps(result, indent=1))
    if not a.no_host_reads:
        result["host_reads"] = host_reads(a, device, npz, min(a.batches))
        for m, said in result["host_reads"].items():
            print(f"host reads, 10 steady steps, {m}: {said}", flush=True)
    Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
