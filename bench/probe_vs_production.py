"""Does the production job confirm the prediction? Production mean step / predicted step at
the point Tula chose and trained, for three workloads, each run through the whole DAG
(`snakemake --cores 2`: check, probes, fit, predict, select, launch), repeats interleaved:

  (a) the shipped default: workflow/config.yaml as is (digits, small_cnn, fp32);
  (b) an image folder (Pillow PNGs, 10 classes, 3 x 32 x 32) with torchvision's ResNet-18,
      2 DataLoader workers per training worker, crop + flip augmentation;
  (c) mnist1d with resnet_tiny in bf16;
  (d) the shipped default with `objective: time_to_accuracy` (it trains at a smaller B than
      the knee, one the partial search did not probe);
  (e) a new user's image folder (Pillow PNGs, 24 x 24 px, 10 classes) with the default model,
      2 DataLoader workers per training worker, N = 2, 3 epochs;
  (f) the shipped default's workload as the user's own script (examples/ddp_train/train.py,
      workload.script): its own DataLoader, model and SGD, probed and trained through
      tula.script;
  (g) the same as the user's own Lightning script (examples/lightning_train/train.py, with
      tula.script.lightning.TulaCallback in its Trainer).

The wall time is compared part by part as well (final.json's wall_check: steps, start-up,
one evaluation pass per epoch and each checkpoint write, as the probes measured them).

    .venv/bin/python bench/probe_vs_production.py [REPEATS] [--only a_default,d_default_tta]
                                                    # default 3 repeats, all five; ~6 min per round

Prints one row per run and the median per workload: step_time_ratio (= final.json's
mean_step_time_s / predicted_step_time_s), production / probe at the same point (after the
DAG, `tula probe` at the trained (N, B) with the same config: is the probe's step the
production step, apart from the fit?), whether the measured mean is inside the predicted
95 % interval, training-time ratio, the DAG's wall time and where the rest of the job's time went.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

from _harness import ROOT, copy_workflow, snakemake, tests_helper, tula

make_image_folder = tests_helper("make_image_folder")  # the tests' Pillow image-folder generator


def workloads(scratch: Path) -> dict[str, dict]:
    base = yaml.safe_load((ROOT / "workflow" / "config.yaml").read_text())
    images = make_image_folder(
        scratch / "images", classes=10, train_per_class=48, val_per_class=12, size=36
    )
    folder = json.loads(json.dumps(base))
    folder["workload"].update(model="tv_resnet18", dataset=f"imagefolder:{images}", epochs=3)
    folder["data"] = {
        "image_size": 32,
        "resize": 32,
        "train_augment": "crop_flip",
        "num_workers": 2,
    }
    folder["grid"].update(batch_min=32, batch_max=128)
    folder["probe"] = {"warmup_steps": 2, "timed_steps": 8, "time_budget_s": 2}
    folder["train"].update(lr=0.05, lr_decay_epochs=[])
    bf16 = json.loads(json.dumps(base))
    bf16["workload"].update(model="resnet_tiny", dataset="mnist1d", epochs=6)
    bf16["train"].update(precision="bf16", lr_decay_epochs=[])
    small = make_image_folder(
        scratch / "images24", classes=10, train_per_class=48, val_per_class=12, size=24
    )
    # a new user: the default model on a folder of 24 px images
    folder24 = json.loads(json.dumps(base))
    folder24["workload"].update(dataset=f"imagefolder:{small}", epochs=3)
    folder24["data"] = {"image_size": 24, "num_workers": 2}
    folder24["grid"]["workers"] = [2]
    tta = json.loads(json.dumps(base))
    tta["objective"] = "time_to_accuracy"
    scripts = {}
    for name, folder_name in (("f_script", "ddp_train"), ("g_lightning", "lightning_train")):
        own = yaml.safe_load((ROOT / "examples" / folder_name / "config.yaml").read_text())
        own["workload"]["script"] = str(ROOT / "examples" / folder_name / "train.py")
        scripts[name] = {**json.loads(json.dumps(base)), "workload": own["workload"]}
    return {
        "a_default": base,
        "b_imagefolder_resnet18": folder,
        "c_mnist1d_resnet_tiny_bf16": bf16,
        "d_default_tta": tta,
        "e_imagefolder_24px": folder24,
        **scripts,
    }


def one_run(workdir: Path, cfg: dict) -> dict:
    (workdir / "workflow" / "config.yaml").write_text(yaml.safe_dump(cfg))
    wall = snakemake(workdir, "--quiet", fresh=True)
    final = json.loads((workdir / "results/train/final.json").read_text())
    # The same point probed directly (same step, same config): separates "the probe times what
    # production runs" from "the fit predicts a point it did not probe".
    n, b = final["workers"], final["global_batch"]
    out = workdir / "results" / "direct_probe.json"
    said = tula(
        "probe",
        "--config",
        ".snakemake/tula/config.json",
        "--workers",
        str(n),
        "--global-batch",
        str(b),
        "--out",
        str(out),
        cwd=workdir,
    )
    rec = json.loads(out.read_text())
    if rec.get("status") != "ok":  # said, and the run's other figures kept
        (workdir / "results" / "direct_probe.log").write_text(said.stdout + said.stderr)
        kept = _keep(workdir)
        print(
            f"direct probe at N={n} B={b} failed: {rec.get('error')}; its log and the run's "
            f"results are kept in {kept}",
            flush=True,
        )
    direct = rec.get("step_time_s") or float("nan")
    # how firmly the probes' noise held the choice (tula select's resamples)
    held = json.loads((workdir / "results/selection.json").read_text()).get("robustness") or {}
    runner = held.get("runner_up") or {}
    return {
        "share": (held.get("chosen") or {}).get("share", float("nan")),
        "settled": held.get("settled"),
        "runner_up": (runner.get("workers"), runner.get("global_batch"), runner.get("share")),
        "N": n,
        "B": b,
        "ratio": final["step_time_ratio"],
        "direct_ratio": final["mean_step_time_s"] / direct,
        "direct_ms": 1e3 * direct,
        "inside": _inside(final["mean_step_time_s"], final["predicted_step_time_interval_s"]),
        "pred_ms": 1e3 * final["predicted_step_time_s"],
        "meas_ms": 1e3 * final["mean_step_time_s"],
        "T_ratio": final["train_time_ratio"],
        "dag_s": wall,
        "eval_s": final["eval_time_s"],
        "ckpt_s": final["checkpoint_time_s"],
        "startup_s": final["startup_time_s"],
        "acc": final["final_test_acc"],
        "wall_ratio": final.get("wall_time_ratio"),
        "wall_inside": _inside(
            final.get("wall_time_s"), final.get("predicted_wall_time_interval_s")
        ),
        "wall_s": final.get("wall_time_s"),
        "parts": {p["part"]: p["ratio"] for p in final.get("wall_check") or []},
    }


def _keep(workdir: Path) -> Path:
    """A copy of this run's results, logs and config, outside the scratch folder the bench
    removes when it ends: what a failure leaves to be read."""
    kept = Path(tempfile.mkdtemp(prefix=f"tula-pvp-{workdir.name}-failed-"))
    for part in ("results", ".snakemake/log", ".snakemake/tula", "workflow/config.yaml"):
        src = workdir / part
        if src.is_dir():
            shutil.copytree(src, kept / part)
        elif src.exists():
            (kept / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, kept / part)
    return kept


def _inside(value, band) -> bool | None:
    """Is ``value`` inside ``band`` ([lo, hi]); None where either is missing."""
    return None if value is None or not band else band[0] <= value <= band[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repeats", nargs="?", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated workload names (default: all)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tula-pvp-") as tmp:
        scratch = Path(tmp)
        configs = workloads(scratch)
        if args.only:
            wanted = args.only.split(",")
            unknown = sorted(set(wanted) - set(configs))
            if unknown:
                sys.exit(f"--only: unknown workload(s) {unknown}; choose from {sorted(configs)}")
            configs = {k: v for k, v in configs.items() if k in wanted}
        dirs = {name: copy_workflow(scratch / name) for name in configs}
        rows: dict[str, list[dict]] = {n: [] for n in configs}
        for i in range(args.repeats):
            for name, cfg in configs.items():  # interleaved: round i runs every workload once
                row = one_run(dirs[name], cfg)
                rows[name].append(row)
                print(
                    f"round {i + 1} {name:28s} N={row['N']} B={row['B']:4d} predicted "
                    f"{row['pred_ms']:8.2f} ms measured {row['meas_ms']:8.2f} ms ratio "
                    f"{row['ratio']:.3f} | probed there {row['direct_ms']:8.2f} ms, "
                    f"production/probe {row['direct_ratio']:.3f} | "
                    f"({'inside' if row['inside'] else 'OUTSIDE'} 95 % interval), T ratio "
                    f"{row['T_ratio']:.3f}, DAG {row['dag_s']:.1f} s (eval {row['eval_s']:.1f} s, "
                    f"checkpoints {row['ckpt_s']:.1f} s, start-up {row['startup_s']:.1f} s), test "
                    f"acc {100 * row['acc']:.1f}%; chosen in {100 * row['share']:.0f} % of the "
                    f"resamples{'' if row['settled'] else ' (not settled)'}; wall time "
                    f"{row['wall_s']:.1f} s, paid / "
                    f"predicted {row['wall_ratio']:.3f} "
                    f"({'inside' if row['wall_inside'] else 'OUTSIDE'} its 95 % interval; "
                    + ", ".join(f"{k} {v:.2f}" for k, v in row["parts"].items() if v is not None)
                    + ")",
                    flush=True,
                )
        print(
            "\n| workload | production / predicted (median) | runs | inside 95 % interval | "
            "production / probe at the same point (median) | runs | median DAG wall |"
        )
        print("|---|---|---|---|---|---|---|")
        for name, rs in rows.items():
            ratios = [r["ratio"] for r in rs]
            direct = [r["direct_ratio"] for r in rs if r["direct_ratio"] == r["direct_ratio"]] or [
                float("nan")
            ]
            print(
                f"| {name} | **{statistics.median(ratios):.3f}** | "
                f"{', '.join(f'{x:.3f}' for x in ratios)} | "
                f"{sum(r['inside'] for r in rs)}/{len(rs)} | **{statistics.median(direct):.3f}** | "
                f"{', '.join(f'{x:.3f}' for x in direct)} | "
                f"{statistics.median(r['dag_s'] for r in rs):.1f} s |"
            )

        print("\n| workload | the choice (N, B): share of the resamples, settled | runner-up |")
        print("|---|---|---|")
        for name, rs in rows.items():
            print(
                f"| {name} | "
                + ", ".join(
                    f"({r['N']}, {r['B']}): {100 * r['share']:.0f} %"
                    + ("" if r["settled"] else ", not settled")
                    for r in rs
                )
                + " | "
                + ", ".join(
                    f"({u[0]}, {u[1]}): {100 * u[2]:.0f} %" if u[2] is not None else "none"
                    for u in (r["runner_up"] for r in rs)
                )
                + " |"
            )

        print(
            "\n| workload | wall time paid / predicted (median) | runs | inside 95 % interval | "
            "steps | start-up | first steps | evaluation | checkpoints |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for name, rs in rows.items():
            walls = [r["wall_ratio"] for r in rs]
            med = {
                k: statistics.median(r["parts"][k] for r in rs)
                for k in ("steps", "start-up", "first steps", "evaluation", "checkpoints")
            }
            print(
                f"| {name} | **{statistics.median(walls):.3f}** | "
                f"{', '.join(f'{x:.3f}' for x in walls)} | "
                f"{sum(bool(r['wall_inside']) for r in rs)}/{len(rs)} | "
                + " | ".join(f"{v:.3f}" for v in med.values())
                + " |"
            )


if __name__ == "__main__":
    main()
