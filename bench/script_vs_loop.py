"""Does tula.script add anything to the step it times? The probe step of the user's own script
(examples/ddp_train/train.py through workload.script) beside Tula's own loop on the same model
(small_cnn's three 1-D convolutions), data (MNIST-1D, 20,000 samples, seed 0, standardised by
the training set's mean and std), optimizer (SGD, momentum 0.9, weight decay 5e-4, LR 0.05,
`train.method: lbt`: no AGS, which the script does not run) and precision (fp32), N = 2 on
this CPU, at a few global batches. Pairs alternate (loop, script, loop, script, ...) so each
pair meets the same moments of the machine; each probe is `tula probe` at one (N, B), as the
DAG runs it, with the shipped default's probe settings.

    .venv/bin/python bench/script_vs_loop.py [PAIRS] [--batches 64,256,1024]

Prints each pair and, per batch, the median step of each arm, the median of the per-pair
ratios script / loop, and the spread of each arm over its repeats (the hour's noise: max / min
of the same code's step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import yaml

from _harness import ROOT, tula

SCRIPT = ROOT / "examples" / "ddp_train" / "train.py"


def configs(scratch: Path) -> dict[str, Path]:
    base = yaml.safe_load((ROOT / "workflow" / "config.yaml").read_text())
    base["train"]["method"] = "lbt"  # plain SGD: the script's way
    loop = json.loads(json.dumps(base))
    script = json.loads(json.dumps(base))
    script["workload"].update(
        script=str(SCRIPT),
        args="--batch-size {local_batch} --lr {lr} --epochs {epochs} --samples 20000".split(),
    )
    out = {}
    for name, cfg in (("loop", loop), ("script", script)):
        out[name] = scratch / f"{name}.yaml"
        out[name].write_text(yaml.safe_dump(cfg))
    return out


def probe(cfg: Path, batch: int, out: Path) -> float:
    """One probe at N = 2, B = ``batch``: its step (s)."""
    args = ["--config", str(cfg), "--workers", "2", "--global-batch", str(batch), "--out", str(out)]
    tula("probe", *args)
    rec = json.loads(out.read_text())
    if rec.get("status") != "ok":
        raise SystemExit(f"probe {cfg.stem} at B={batch}: {rec.get('status')} {rec.get('error')}")
    return rec["step_time_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pairs", nargs="?", type=int, default=5)
    ap.add_argument("--batches", default="64,256,1024")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory(prefix="tula-svl-") as tmp:
        scratch = Path(tmp)
        cfgs = configs(scratch)
        got: dict[int, dict[str, list[float]]] = {b: {"loop": [], "script": []} for b in batches}
        for i in range(args.pairs):
            for b in batches:
                for arm in ("loop", "script"):
                    t = probe(cfgs[arm], b, scratch / f"{arm}-{b}-{i}.json")
                    got[b][arm].append(t)
                loop, script = got[b]["loop"][-1], got[b]["script"][-1]
                print(
                    f"pair {i + 1} B={b:5d}: loop {1e3 * loop:7.2f} ms, script "
                    f"{1e3 * script:7.2f} ms, script / loop {script / loop:.3f}",
                    flush=True,
                )
        print(
            "\n| B | loop step (median) | script step (median) | script / loop, per pair "
            "(median, range) | loop's own spread | script's own spread |"
        )
        print("|---|---:|---:|---|---:|---:|")
        for b in batches:
            lo, sc = got[b]["loop"], got[b]["script"]
            ratios = [s / x for s, x in zip(sc, lo)]
            print(
                f"| {b} | {1e3 * statistics.median(lo):.2f} ms | "
                f"{1e3 * statistics.median(sc):.2f} ms | {statistics.median(ratios):.3f} "
                f"({min(ratios):.3f}-{max(ratios):.3f}) | x{max(lo) / min(lo):.2f} | "
                f"x{max(sc) / min(sc):.2f} |"
            )


if __name__ == "__main__":
    main()
