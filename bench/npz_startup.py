"""A large uint8 `npz` set: what loading it costs a probe, this checkout against another.

Writes (once, kept in --dir) an `npz` of uint8 images, 1 x 28 x 28, at least 500 MB, then in
fresh interpreters, each checkout's ``src`` first on PYTHONPATH, measures:

- ``load``: seconds to load the set (:func:`tula.runtime.input.data.load`) and hand its first batch
  of 256 through the device feed (here the CPU), and the process's peak RSS (ru_maxrss);
- ``probe``: a real one-worker `tula probe` at B = 64 (sweep, noise and input reads off): its
  record's start-up (process start to its first step) and peak RSS.

Median of --repeats runs each, the two checkouts alternated.

    git worktree add /tmp/before <commit>
    .venv/bin/python bench/npz_startup.py --before /tmp/before [--repeats 3] [--dir /tmp/npz]

With --layouts, this checkout alone on the same images stored two ways, alternated: channels
first, (n, 3, 16, 16), and channels last, (n, 16, 16, 3), which the loader lays out channels
first as it loads (a copy of the set; 3 channels, since numpy moves an axis of 1 without one):

    .venv/bin/python bench/npz_startup.py --layouts [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
SAMPLES, SHAPE = 640_000, (1, 28, 28)  # 640,000 x 784 bytes = 502 MB of training images
RGB = (3, 16, 16)  # --layouts: 640,000 x 768 bytes = 492 MB, in three channels

LOAD = """
import json, resource, sys, time
import torch
t0 = time.perf_counter()
from tula import config
from tula.runtime.input import data, loader
from tula.runtime.input.feed import DeviceFeed
cfg = config.from_dict({"workload": {"dataset": "npz:%s"}})
d = data.load_config(cfg)
loaders = loader.Loaders(cfg, d, 0, 1, torch.device("cpu"))
ld, sampler = loaders.train(256)
feed = DeviceFeed.of(loaders, ld, sampler, channels_last=False)
sampler.set_position(1, 0)
x, _ = next(iter(feed))
print(json.dumps({"s": time.perf_counter() - t0, "rss": resource.getrusage(
    resource.RUSAGE_SELF).ru_maxrss * 1024, "dtype": str(d.train.x.dtype), "x": str(x.dtype),
    "sample": list(d.input_shape)}))
"""


def make_set(path: Path, shape=SHAPE, channels_last: bool = False) -> None:
    if path.exists():
        return
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(SAMPLES, *shape), dtype=np.uint8)
    if channels_last:
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    xt = x[:2000].copy()
    np.savez(
        path, x_train=x, y_train=np.arange(SAMPLES) % 10, x_test=xt, y_test=np.arange(2000) % 10
    )


def run_load(src: Path, npz: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", LOAD % npz], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_probe(src: Path, npz: Path, work: Path) -> dict:
    cfg = work / "npz.yaml"
    raw = {
        "workload": {"dataset": f"npz:{npz}"},
        "grid": {"workers": [1], "batch_min": 64, "batch_max": 64},
        "probe": {
            "warmup_steps": 2,
            "timed_steps": 10,
            "time_budget_s": 1,
            "sweep_steps": 0,
            "noise_steps": 0,
            "input_batches": 0,
        },
    }
    cfg.write_text(yaml.safe_dump(raw))
    bindir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PYTHONPATH": str(src),
        "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
    }
    out = work / "N1_B64.json"
    code = (
        f"import sys; from tula.stages import probe; probe.run({str(cfg)!r}, 1, 64, {str(out)!r})"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    rec = json.loads(out.read_text())
    assert rec["status"] == "ok", rec.get("error")
    return {
        "startup_s": rec["startup_time_s"],
        "rss": rec["rss_peak_bytes"],
        "wall_s": rec["wall_s"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="another checkout (its src/)")
    ap.add_argument(
        "--layouts", action="store_true", help="this checkout, channels first against last"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "tula-npz-bench")
    a = ap.parse_args()
    if (a.before is None) == (not a.layouts):
        ap.error("give --before CHECKOUT or --layouts")
    a.dir.mkdir(parents=True, exist_ok=True)
    npz = a.dir / ("u8_chw.npz" if a.layouts else "u8.npz")
    make_set(npz, RGB if a.layouts else SHAPE)
    print(f"{npz}: {npz.stat().st_size / 1e6:.0f} MB", flush=True)
    if a.layouts:
        hwc = a.dir / "u8_hwc.npz"
        make_set(hwc, RGB, channels_last=True)
        sides = {"(n, 3, 16, 16)": (ROOT / "src", npz), "(n, 16, 16, 3)": (ROOT / "src", hwc)}
    else:
        sides = {"before": (a.before / "src", npz), "after": (ROOT / "src", npz)}
    runs: dict[str, dict[str, list]] = {k: {"load": [], "probe": []} for k in sides}
    for i in range(a.repeats):
        for name, (src, path) in sides.items():
            runs[name]["load"].append(run_load(src, path))
            runs[name]["probe"].append(run_probe(src, path, a.dir))
            print(
                f"run {i + 1} {name}: {runs[name]['load'][-1]} {runs[name]['probe'][-1]}",
                flush=True,
            )
    print(
        f"\n| {'stored as' if a.layouts else 'checkout'} | set held as | load + first batch (s) "
        "| its peak RSS (GB) | probe start-up (s) | probe peak RSS (GB) | probe wall (s) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in sides:
        ld, pr = runs[name]["load"], runs[name]["probe"]

        def med(rows, key, scale=1.0):
            return statistics.median(r[key] for r in rows) / scale

        print(
            f"| {name} | {ld[0]['dtype']} | {med(ld, 's'):.2f} | {med(ld, 'rss', 1e9):.2f} | "
            f"{med(pr, 'startup_s'):.2f} | {med(pr, 'rss', 1e9):.2f} | {med(pr, 'wall_s'):.1f} |"
        )


if __name__ == "__main__":
    main()
