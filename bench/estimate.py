"""How far the estimate from the model alone (tula check: the step under FakeTensorMode) is from
the memory probe's measurement, and how long `tula check` takes with it.

1. Every shipped model (digits, 1 x 8 x 8) and torchvision's ResNet-18 (an image folder of
   --size px JPEGs), each at three local batches: `tula check` writes the estimate for this
   machine's device (CPU), then `tula memprobe --workload` measures the real step at the same
   batches on one CPU worker (AGS, fp32, the defaults) and writes the estimate's error at each.
2. ResNet-50 at 224 px, bf16 autocast, channels_last, SGD with momentum (train.method lbt), for
   CUDA: the estimate's per-sample term against the figure measured on one H100 80 GB with
   torch.cuda.max_memory_allocated (42.0 MiB a sample; the memory model fitted from that run's
   memory probe gave 43.4). No GPU here: only the estimate side runs.
3. `tula check` on that ResNet-50 config with hardware.gpu h100, timed end to end (a fresh
   process: imports, the dataset, a real forward on two samples, the estimate, the plan).

    .venv/bin/python bench/estimate.py [--out estimate.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from _harness import env, tests_helper, tula

H100_MIB_PER_SAMPLE = 42.0  # max_memory_allocated, one H100: ResNet-50 224 px bf16
H100_FITTED_MIB_PER_SAMPLE = 43.4  # the memory model fitted from that run's memory probe
SHIPPED = ("small_cnn", "resnet_tiny", "vgg_tiny", "alexnet_tiny", "mobilenet_tiny")


def _config(path: Path, **sections) -> Path:
    base = {
        "grid": {"workers": [1], "batch_min": 8, "batch_max": 64},
        "hardware": {"device": "cpu", "device_memory_gb": None},
    }
    for k, v in sections.items():
        base[k] = {**base.get(k, {}), **v}
    path.write_text(yaml.safe_dump(base))
    return path


def against_probe(
    work: Path, name: str, dataset: str, batches: list[int], batch_max: int = 128
) -> dict:
    cfg = _config(
        work / f"{name}.yaml",
        workload={"model": name, "dataset": dataset},
        grid={"batch_min": batches[0], "batch_max": batch_max},
        probe={"memory_batches": batches, "timeout_s": 1200},
    )
    wl, mp = work / f"{name}.workload.json", work / f"{name}.memory_probe.json"
    tula("check", "--config", str(cfg), "--out", str(wl))
    tula("memprobe", "--config", str(cfg), "--workload", str(wl), "--out", str(mp))
    rec = json.loads(mp.read_text())
    check = rec["estimate"]["against_probe"]
    fit = rec["memory_model"]["fit"]
    return {
        "model": name,
        "points": check["points"],
        "probe_fixed_mib": fit["intercept"] / 2**20,
        "probe_per_sample_mib": fit["slope"] / 2**20,
        "estimate_fixed_mib": rec["estimate"]["fixed_bytes"] / 2**20,
        "estimate_per_sample_mib": rec["estimate"]["per_sample_bytes"] / 2**20,
        "per_sample_error": check["per_sample_error"],
        "fixed_error": check["fixed_error"],
        "error_at_largest": check["error_at_largest"],
    }


def resnet50_for_cuda(work: Path, folder: Path) -> tuple[dict, list[float]]:
    """The estimate for CUDA of the H100 figure's setup, and `tula check`'s wall times with it."""
    cfg = _config(
        work / "r50.yaml",
        workload={"model": "tv_resnet50", "dataset": f"imagefolder:{folder}"},
        grid={"workers": [1, 2, 4, 8], "batch_min": 32, "batch_max": 1024},
        hardware={"device": "auto", "gpu": "h100", "device_memory_gb": 80},
        train={"precision": "bf16", "channels_last": True, "method": "lbt"},
        data={"image_size": 224},
    )
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        r = subprocess.run(
            ["tula", "check", "--config", str(cfg), "--out", str(work / "r50.json")],
            env=env(),
            capture_output=True,
            text=True,
        )
        walls.append(time.perf_counter() - t0)
        if r.returncode:
            sys.exit(r.stdout[-3000:] + r.stderr[-3000:])
    print(r.stdout)
    return json.loads((work / "r50.json").read_text())["estimate"], walls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=224, help="ResNet-18's image side (px)")
    ap.add_argument("--out", default="estimate.json")
    a = ap.parse_args()
    make_jpeg_folder = tests_helper("make_jpeg_folder")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in SHIPPED:
            rows.append(against_probe(work, name, "digits", [8, 32, 128]))
        folder = make_jpeg_folder(work / "jpegs", n=4, size=(a.size, a.size))
        # grid.batch_max 8: the folder's 8 training images are an epoch; a larger batch is cut to it
        rows.append(
            against_probe(work, "tv_resnet18", f"imagefolder:{folder}", [2, 4, 8], batch_max=8)
            | {"image_px": a.size}
        )
        r50, walls = resnet50_for_cuda(work, folder)
    print(f"{'model':16} {'b':>4} {'probe MiB':>10} {'estimate':>9} {'error':>7}")
    for r in rows:
        for p in r["points"]:
            print(
                f"{r['model']:16} {p['local_batch']:>4} {p['measured_bytes'] / 2**20:>10.2f} "
                f"{p['estimate_bytes'] / 2**20:>9.2f} {p['error']:>+7.1%}"
            )
        print(
            f"{'':16} per sample {r['estimate_per_sample_mib']:.3f} vs "
            f"{r['probe_per_sample_mib']:.3f} MiB ({r['per_sample_error']:+.1%}); "
            f"fixed {r['estimate_fixed_mib']:.2f} vs "
            f"{r['probe_fixed_mib']:.2f} MiB ({r['fixed_error']:+.1%})"
        )
    slope = r50["per_sample_bytes"] / 2**20
    print(
        f"ResNet-50 224 px bf16 channels_last, for CUDA: {slope:.2f} MiB/sample "
        f"({slope / H100_MIB_PER_SAMPLE - 1:+.1%} vs the H100's {H100_MIB_PER_SAMPLE}, "
        f"{slope / H100_FITTED_MIB_PER_SAMPLE - 1:+.1%} vs its fitted "
        f"{H100_FITTED_MIB_PER_SAMPLE}); "
        f"fixed {r50['fixed_bytes'] / 2**20:.0f} MiB; {r50['flops_per_sample'] / 1e9:.1f} "
        f"GFLOP/sample; estimate {r50['seconds']:.1f} s; tula check "
        f"{', '.join(f'{w:.1f}' for w in walls)} s (median {statistics.median(walls):.1f})"
    )
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"cpu_probe": rows, "resnet50_cuda": r50, "check_wall_s": walls}, indent=1)
    )
    print(f"-> {out}")


if __name__ == "__main__":
    main()
