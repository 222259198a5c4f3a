import contextlib
import copy
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
# A run's own partition's folder when the profile names no partition (tula.partitions.table):
# its probes, logs and the files results/ holds copies of
OWN = Path("results") / "partitions" / "default"

# Where the suite's time goes, printed at the end of every run (tests/suite_time.py), and how
# make test's two xdist workers share the machine (tests/sharing.py).
pytest_plugins = ["skipped", "suite_time", "sharing"]

# A GPU partition as scontrol and sinfo describe it (tests of tula.slurm and tula.preflight).
GPU_PARTITION = (
    "PartitionName=gpu AllowGroups=ALL Default=NO MaxNodes=4 MaxTime=2-00:00:00 State=UP "
    "TotalCPUs=192 TotalNodes=6 Nodes=g[01-06]"
)
GPU_NODES = (
    "g01|32|gpu:a100:4(S:0-1)\ng02|32|gpu:a100:4(S:0-1)\ng03|32|gpu:a100:4(S:0-1)\ng04|32|gpu:a100:4\n"
    "g05|32|gpu:v100:2,gpu:t4:1\ng06|32|(null)\ng01|32|gpu:a100:4(S:0-1)\n"
)

# A config small enough for real multi-process runs on a 2-core machine.
# Snakemake lays a test's --configfile over the shipped workflow/config.yaml (the demo's
# default): every key the demo sets that a test's run depends on is named here, so a change to
# the demo does not change what the suite runs (the schema's defaults for search, knee_rule and
# probe.precision, which the demo sets otherwise).
TINY = {
    "workload": {"model": "small_cnn", "dataset": "digits", "epochs": 2, "seed": 0},
    "grid": {"workers": [1, 2], "batch_min": 32, "batch_max": 128},
    "search": "partial",
    "knee_rule": "marginal",
    "probe": {
        "warmup_steps": 1,
        "timed_steps": 3,
        "timeout_s": 120,
        "time_budget_s": 0.5,
        "precision": 0.02,
    },
    "train": {"lr_decay_epochs": []},
}
# The shared runs whose production step tests bound against its prediction (TIMED_RUNS of
# tests/sharing.py): the probes time 1 s a point, not 0.5. This machine's speed wanders over
# fractions of a second: two 0.5 s windows of the same step in different processes lay x0.76-x1.32
# apart (95 %), two 1 s windows x0.88-x1.14, inside the bounds' 15 % drift (bench/machine_noise.py,
# BENCHMARKS.md "The machines and their noise"); the production job times about 1 s of steps.
TIMED_TINY = {**TINY, "probe": {**TINY["probe"], "time_budget_s": 1.0}}


def digits_uint8(path: Path) -> Path:
    """digits as the tiny config's 80/20 split holds it, stored as uint8 images (its pixels are
    the integers 0-16) in an npz: a set Tula standardises per batch on the device, as a uint8
    image set is (the path a twice-standardised batch broke, and an accuracy bound catches)."""
    from tula.runtime.input.builtin_sets import digits

    x_train, x_test, y_train, y_test = digits(TINY["workload"]["seed"])
    assert (x_train == x_train.round()).all() and x_train.max() <= 16
    np.savez(
        path,
        x_train=x_train.astype(np.uint8),
        y_train=y_train,
        x_test=x_test.astype(np.uint8),
        y_test=y_test,
    )
    return path


@pytest.fixture
def tiny_raw():
    return copy.deepcopy(TINY)


@pytest.fixture
def tiny_config_file(tmp_path, tiny_raw):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tiny_raw))
    return path


@pytest.fixture
def venv_path(monkeypatch):
    """Put this interpreter's bin/ first on PATH, so `tula`, `snakemake`, `torchrun` resolve."""
    import sys

    bindir = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", bindir + os.pathsep + os.environ.get("PATH", ""))
    return bindir


def copy_workflow(dest: Path) -> None:
    """Copy the Snakemake workflow (not results) into dest, resolving the schema link."""
    shutil.copy(ROOT / "Snakefile", dest / "Snakefile")
    shutil.copytree(ROOT / "rules", dest / "rules")
    shutil.copytree(ROOT / "envs", dest / "envs")
    (dest / "workflow").mkdir()
    shutil.copytree(ROOT / "workflow" / "report", dest / "workflow" / "report")
    shutil.copy(ROOT / "workflow" / "config.schema.yaml", dest / "workflow" / "config.schema.yaml")


# `snakemake` for the suite's runs under the SLURM executor: its status checks every 2 s, not
# backed off by 10 s a check while the jobs run (tests/held_polls.py says why)
SLURM_SNAKEMAKE = [sys.executable, str(ROOT / "tests" / "held_polls.py")]


def slurm_test_profile(wd: Path, launch_minutes: int = 10, **changes) -> str:
    """profiles/test in ``wd``: profiles/slurm with the test cluster's account and memory and
    short waits (its jobs take seconds), the launch's time limit ``launch_minutes``,
    ``changes`` (profile keys) updated. Returns the profile's path in ``wd``
    (bench/lost_login_session.py uses it too)."""
    profile = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    profile["default-resources"] = {
        **profile["default-resources"],
        "slurm_account": "root",
        "mem_mb": 1000,
    }
    profile["set-resources"]["launch"]["runtime"] = launch_minutes
    profile.update(
        {"slurm-init-seconds-before-status-checks": 2, "latency-wait": 5, "retries": 0, "jobs": 4}
    )
    profile.update(changes)
    (wd / "profiles" / "test").mkdir(parents=True)
    (wd / "profiles" / "test" / "config.yaml").write_text(yaml.safe_dump(profile))
    return "profiles/test"


def lab_workdir(
    where: Path, *, held_polls: bool = True, **changes: dict
) -> tuple[list[str], dict[str, str]]:
    """The workflow and the shipped lab profile and config (profiles/lab: grid.workers 1, 2,
    4; two workers a node; the partition `lab` of `scripts/slurm-cluster.sh up --nodes 2`;
    ``changes``: sections of the config updated) in ``where``: the snakemake command a user
    runs there (docs/slurm.md), its status checks held (SLURM_SNAKEMAKE) unless not
    ``held_polls``, and its environment (tests/test_slurm_lab.py, bench/slurm_lab.py)."""
    copy_workflow(where)
    (where / "workflow" / "config.yaml").write_text((ROOT / "workflow" / "config.yaml").read_text())
    shutil.copytree(ROOT / "profiles" / "lab", where / "profiles" / "lab")
    lab = yaml.safe_load((ROOT / "profiles" / "lab" / "tula.yaml").read_text())
    for section, values in changes.items():
        lab[section] = {**lab.get(section, {}), **values} if isinstance(values, dict) else values
    (where / "profiles" / "lab" / "tula.yaml").write_text(yaml.safe_dump(lab))
    env = venv_env()
    snakemake = SLURM_SNAKEMAKE if held_polls else ["snakemake"]
    cmd = ["timeout", "-s", "INT", "900", *snakemake, "--profile", "profiles/lab"]
    return [*cmd, "--configfile", "profiles/lab/tula.yaml"], env


def train_from_files(cfg_path, selection, out_dir, **kw) -> dict:
    """The production launcher as `tula launch` calls it: the config and selection.json read
    into records first (tula.stages.launch)."""
    from tula import config
    from tula.production import launcher
    from tula.stages.launch import selected_point

    return launcher.train(config.load(cfg_path), selected_point(selection), out_dir, **kw)


def lab_launch_command(run_dir: Path, out: Path, **launch) -> list[str]:
    """`tula launch` in ``out`` at the choice of a lab workflow run in ``run_dir`` (its config
    snapshot, selection and predictions): 8 epochs, on the partition `lab`, ``launch``'s keys
    updated (checkpoint_every_steps, node_wait_min)."""
    raw = json.loads((run_dir / ".snakemake" / "tula" / "config.json").read_text())
    raw["workload"]["epochs"] = 8
    raw["launch"].update(
        executor="slurm", slurm_partition="lab", slurm_account="root", timeout_min=10, poll_s=1
    )
    raw["launch"].update(launch)
    (out / "config.yaml").write_text(yaml.safe_dump(raw))
    res = run_dir / "results"
    cmd = ["tula", "launch", "--config", "config.yaml", "--selection", str(res / "selection.json")]
    return cmd + ["--predictions", str(res / "predictions.csv"), "--out-dir", "train"]


def slurm_controller_answers() -> bool:
    import subprocess

    if not shutil.which("sbatch"):
        return False
    return subprocess.run(["scontrol", "ping"], capture_output=True, text=True).returncode == 0


@pytest.fixture(scope="session")
def slurm_cluster():
    """A SLURM controller to submit to. `make test` under CI=true starts one and sets
    TULA_REQUIRE_SLURM=1: then a missing controller fails the test instead of skipping it."""
    if slurm_controller_answers():
        return True
    if os.environ.get("TULA_REQUIRE_SLURM") == "1":
        pytest.fail(
            "TULA_REQUIRE_SLURM=1 but no SLURM controller answers (scripts/slurm-cluster.sh up "
            "failed?)"
        )
    pytest.skip("no SLURM controller answers (start one as root: scripts/slurm-cluster.sh up)")


TESTS = Path(__file__).resolve().parent

# Fixtures that only end-to-end tests use: real worker processes (tula/torchrun/snakemake on
# PATH), the whole DAG, a SLURM cluster. A test using one is `slow`; `make test-fast` (pytest
# -m "not slow") leaves them out for quick local runs. CI runs everything.
SLOW_FIXTURES = {"venv_path", "slurm_cluster", "lab_cluster"}
# The shared runs (each made once per session, or once per module where only it reads it): a
# test that reads one says so in its marker, as a test that runs its own does explicitly.
DAG_FIXTURES = {"finished_run", "recipe_run", "dag_on_slurm", "lab_run"}
TRAINING_FIXTURES = {"reference", "unmonitored", "folder_reference", "script_reference"}
RUN_MARKERS = ("dag", "training", "probe", "slurm", "netlab")


def pytest_collection_modifyitems(config, items):
    # The lab's tests after the other SLURM tests: the lab cluster replaces the one-node cluster
    # while it is up, and is brought up once (lab_cluster). (xdist hands out its groups largest
    # first, the SLURM group first of all: its jobs wait on the controller while the other
    # worker computes.)
    items.sort(key=lambda item: "lab_cluster" in getattr(item, "fixturenames", ()))
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & DAG_FIXTURES:
            item.add_marker(pytest.mark.dag)
        if used & TRAINING_FIXTURES:
            item.add_marker(pytest.mark.training)
        if used & SLOW_FIXTURES or any(item.get_closest_marker(m) for m in RUN_MARKERS):
            item.add_marker(pytest.mark.slow)


def snakemake(workdir, *args, env=None, timeout=900):
    """`snakemake --cores 2 ARGS` in ``workdir`` (bounded: SIGINT after ``timeout`` s)."""
    import subprocess

    cmd = ["timeout", "-s", "INT", str(timeout), "snakemake", "--cores", "2", *args]
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=env)


def venv_env(**extra: str) -> dict[str, str]:
    """This environment with this interpreter's bin/ first on PATH (tula, torchrun, snakemake)."""
    return dict(
        os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **extra
    )


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """The whole DAG once per session, as `make run` runs it (snakemake --cores 2) on the tiny
    config, with one probe failing for real (an injected OOM at N2_B128, rank 1): the DAG must
    still finish. Tests read its files, or copy it to change it; the few that change it in place
    (tests/test_dag.py) re-run only light stages, or the training, and say so."""
    from tula.faults import ENV as FAULT_ENV

    wd = tmp_path_factory.mktemp("dag")
    copy_workflow(wd)
    (wd / "workflow" / "config.yaml").write_text((ROOT / "workflow" / "config.yaml").read_text())
    (wd / "tiny.yaml").write_text(yaml.safe_dump(TIMED_TINY))
    env = venv_env(**{FAULT_ENV: "oom:point=N2_B128,rank=1"})
    r = snakemake(wd, "--configfile", "tiny.yaml", env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    (wd / "snakemake.out").write_text(r.stdout + r.stderr)
    return wd, env


# The way most users train (the way of training the issue that added it targets): AdamW, a
# cosine schedule after a warm-up, label smoothing
RECIPE = {
    "optimizer": "adamw",
    "optimizer_args": {"betas": [0.9, 0.99]},
    "schedule": "cosine",
    "warmup_epochs": 1,
    "label_smoothing": 0.1,
    "grad_clip_norm": 1.0,
    "no_weight_decay": ["norm", "bias"],
    "ema_decay": 0.9,
    "metric": "torchmetrics.classification:MulticlassF1Score",
    "metric_args": {"num_classes": 10, "average": "macro"},
    "accumulate": 2,  # every step as two micro-batches: probed, priced and trained so
}


@pytest.fixture(scope="session")
def recipe_run(tmp_path_factory):
    """The whole DAG once per session on the tiny config trained with RECIPE, in two runs as a
    user would make them: `snakemake plan` (everything up to the choice and the report, no
    training; what it left is kept in ``plan``: its terminal output and its results files),
    then `snakemake` (snakemake --cores 2), which reuses the plan's probes and trains:
    probes, fits, the choice and the production job all run AdamW with its schedule."""
    wd = tmp_path_factory.mktemp("dag-recipe")
    copy_workflow(wd)
    (wd / "workflow" / "config.yaml").write_text((ROOT / "workflow" / "config.yaml").read_text())
    tiny = copy.deepcopy(TIMED_TINY)
    tiny["train"].update(RECIPE)
    (wd / "tiny.yaml").write_text(yaml.safe_dump(tiny))
    env = venv_env()
    r = snakemake(wd, "plan", "--configfile", "tiny.yaml", env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    plan = {
        "out": r.stdout + r.stderr,
        "files": sorted(str(p.relative_to(wd)) for p in (wd / "results").rglob("*")),
        "report": (wd / "results" / "plan" / "report.html").read_text(),
    }
    r = snakemake(wd, "--configfile", "tiny.yaml", env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    (wd / "snakemake.out").write_text(r.stdout + r.stderr)
    return wd, env, plan


CLUSTER = ["bash", str(ROOT / "scripts" / "slurm-cluster.sh")]
LAB_NODES = ("tula-n0", "tula-n1")  # the lab's namespaces, and its SLURM nodes
LAB_RATE = "200mbit"  # each lab link, unless a test re-shapes it (and shapes it back)


def cluster(*args: str) -> str:
    """scripts/slurm-cluster.sh ARGS, which must succeed."""
    import subprocess

    r = subprocess.run([*CLUSTER, *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def lab_namespaces() -> list[str]:
    import subprocess

    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    return [n for n in names if n.startswith("tula-n")]


@pytest.fixture(scope="session")
def lab_cluster():
    """The network lab as a two-node SLURM cluster (`scripts/slurm-cluster.sh up --nodes 2
    --partitions 2`: namespaces tula-n0 and tula-n1 joined by links shaped at LAB_RATE, one
    slurmd in each; partition lab holds both, lab0 and lab1 one each),
    brought up once for every test that needs it: the SLURM lab's (tests/test_slurm_lab.py)
    and the network lab's (tests/test_netlab.py, which places workers in the same namespaces).
    Those tests run after all others (pytest_collection_modifyitems), so that the one-node
    cluster the other SLURM tests use is switched once; however they end, the lab goes and
    that cluster comes back (or nothing is left, where none ran before). Needs root; in CI a
    lab that cannot be made fails the tests instead of skipping them."""
    required = os.environ.get("CI") == "true" or os.environ.get("TULA_REQUIRE_SLURM") == "1"
    missing = [t for t in ("sbatch", "slurmd", "ip", "tc", "nsenter") if not shutil.which(t)]
    if os.geteuid() != 0 or missing:
        why = f"the two-node lab cluster needs root and {missing or 'its tools'}"
        pytest.fail(why + ", which CI has") if required else pytest.skip(why)
    had_one_node = slurm_controller_answers()
    try:
        cluster("up", "--nodes", "2", "--rate", LAB_RATE, "--slots", "2", "--partitions", "2")
        yield LAB_NODES
    finally:
        cluster("up") if had_one_node else cluster("down")
        assert not lab_namespaces(), "the lab's namespaces outlived the tests"
        assert "tula-slurm-lab" not in Path("/etc/hosts").read_text()


@pytest.fixture
def user_pythonpath(monkeypatch):
    """tests/ on PYTHONPATH (for worker processes) and sys.path: `user_workload:...` imports."""

    monkeypatch.setenv("PYTHONPATH", str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.syspath_prepend(str(TESTS))


def make_image_folder(
    root: Path, classes: int = 10, train_per_class: int = 12, val_per_class: int = 4, size: int = 20
) -> Path:
    """root/train/<class>/*.png and root/val/<class>/*.png: RGB PNGs written with Pillow; each
    class has its own colour and stripe direction (learnable), plus per-image noise."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", train_per_class), ("val", val_per_class)):
        for c in range(classes):
            d = root / split / f"class_{c:02d}"
            d.mkdir(parents=True, exist_ok=True)
            colour = np.array(
                [(37 * c) % 256, (91 * c + 50) % 256, (151 * c + 100) % 256], dtype=float
            )
            for i in range(n):
                img = np.tile(colour, (size, size, 1)) + rng.normal(0, 20, (size, size, 3))
                stripes = (np.arange(size) // 2) % 2 == 0
                if c % 2:
                    img[stripes, :, :] *= 0.5
                else:
                    img[:, stripes, :] *= 0.5
                Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(d / f"{i:03d}.png")
    return root


def make_jpeg_folder(root: Path, n: int = 3, size: tuple[int, int] = (37, 29)) -> Path:
    """root/{train,val}/<class>/*.jpg written by Pillow, sizes varying per image."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(1)
    for split in ("train", "val"):
        for c in range(2):
            d = root / split / f"c{c}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                h, w = size[1] + 3 * (i % 5), size[0] - 2 * (i % 5)
                Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(
                    d / f"{i}.jpg", quality=90
                )
    return root


@pytest.fixture
def image_folder(tmp_path):
    return make_image_folder(tmp_path / "images")


def synthetic(collective: str, rng, noise: float = 0.0) -> pd.DataFrame:
    """Probe rows from compute = c0 + c1*b and exposed sync = s1*x(N) + a*l(N) (additive);
    the known answer of the fit tests (test_perfmodel.py, test_memory.py)."""
    from tula.model import perf as perfmodel

    c0, c1, s1, a = 0.004, 0.0002, 0.05, 0.002
    rows = []
    for n in (1, 2, 4, 8):
        for B in (32, 64, 128, 256):
            b = B // n
            comp = c0 + c1 * b
            nn = np.array([float(n)])
            sync = (
                0.0
                if n == 1
                else float(
                    s1 * perfmodel.sync_feature(collective, nn)[0]
                    + a * perfmodel.LATENCY_TERMS[collective][1](nn)[0]
                )
            )
            e = rng.normal(1, noise, 2) if noise else (1, 1)
            rows.append(
                dict(
                    workers=n,
                    global_batch=B,
                    local_batch=b,
                    compute_time_s=comp * e[0],
                    step_time_s=comp * e[0] + sync * e[1],
                    peak_mem_bytes=1e6 + 5e4 * b,
                    status="ok",
                    source="probe",
                    step_time_cv=noise or np.nan,
                )
            )
    df = pd.DataFrame(rows)
    df["sync_time_s"] = df["step_time_s"] - df["compute_time_s"]
    return df


def checkpoint_state(v):
    """A small training state to checkpoint (tests of tula.checkpoint and of resuming)."""
    import torch

    return {
        "fingerprint": "f",
        "epoch": 1,
        "offset": 0,
        "global_batch": 8,
        "w": torch.full((3,), float(v)),
    }


def bitwise_equal(a: dict, b: dict) -> bool:
    """Two state dicts (or named parameters) hold the same tensors, bit for bit."""
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def load_params(path) -> dict:
    """A saved state dict (model.pt), on the CPU."""
    import torch

    return torch.load(path, map_location="cpu")


@contextlib.contextmanager
def when_step_reached(steps_csv: Path, step: float, action):
    """While the block runs: once the production job's steps.csv (tula.production.monitor) has a
    row at or past ``step``, call ``action()`` once (a thread looks every 0.2 s). Yields a dict
    that gets that row's step. The network lab's tests and bench/drift.py slow a link so."""
    import threading

    done: dict = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.2):
            try:
                last = int(pd.read_csv(steps_csv)["step"].iloc[-1])
            except (FileNotFoundError, IndexError, KeyError, pd.errors.EmptyDataError):
                continue
            if last >= step:
                action()
                done["step"] = last
                return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield done
    finally:
        stop.set()
        thread.join()


def synced_probes(local_batches, workers=(1, 2, 4)) -> pd.DataFrame:
    """Probe rows whose compute is linear in the local batch (10 ms + 1 ms a sample) and whose
    multi-worker steps pay 4 ms of sync: enough for a perf model with a sync (step) part."""
    return pd.DataFrame(
        [
            dict(
                workers=n,
                global_batch=n * lb,
                local_batch=lb,
                status="ok",
                source="probe",
                peak_mem_bytes=1.0,
                compute_time_s=0.01 + 0.001 * lb,
                step_time_s=0.01 + 0.001 * lb + (0.004 if n > 1 else 0.0),
            )
            for n in workers
            for lb in local_batches
        ]
    )


def prediction_table(times: dict[tuple[int, int], float], feasible=None) -> pd.DataFrame:
    """predictions.csv's columns that the choice reads, one row per (N, B) of ``times`` (its
    T); ``feasible``: the points that are not."""
    rows = []
    for (n, b), t in times.items():
        rows.append(
            dict(
                workers=n,
                global_batch=b,
                local_batch=b // n,
                step_time_s=t / 10,
                train_time_s=t,
                cost=t * n,
                mem_bytes=1e6,
                feasible=True,
                probe_status="",
            )
        )
    df = pd.DataFrame(rows)
    if feasible is not None:
        df["feasible"] = [feasible.get((r.workers, r.global_batch), True) for r in df.itertuples()]
    return df


@contextlib.contextmanager
def holding(partition: str, minutes: int = 20):
    """A job that holds ``partition``'s node (exclusive, a ``minutes`` limit, sleeping) while
    the block runs, so that the next job there waits; cancelled however the block ends."""
    import subprocess

    cmd = ["sbatch", "--parsable", f"--partition={partition}", "--exclusive"]
    cmd += [f"--time={minutes}", "--job-name=tula-holder", "--output=/dev/null"]
    out = subprocess.run([*cmd, "--wrap=sleep 3600"], capture_output=True, text=True, check=True)
    holder = out.stdout.strip().split(";")[0]
    try:
        state = ""
        for _ in range(120):  # until it runs
            state = subprocess.run(
                ["squeue", "-h", "-j", holder, "-o", "%T"], capture_output=True, text=True
            ).stdout.strip()
            if state == "RUNNING":
                break
            time.sleep(0.5)
        assert state == "RUNNING", f"the holder job {holder} is {state!r}"
        yield holder
    finally:
        subprocess.run(["scancel", holder], check=False)


REPLAN_D, REPLAN_B = 1437, 64


def replan_table(compute2=0.040, sync2=0.005, compute1=0.060):
    """launch.replan's tests (tests/model/test_refit.py, tests/production/test_replan.py): two
    points of a one-node grid: N = 2 (with a little sync) and N = 1, at B = 64."""
    spe = -(-REPLAN_D // REPLAN_B)  # steps per epoch, the last one short
    rows = []
    for n, comp, sync in ((1, compute1, 0.0), (2, compute2, sync2)):
        step = comp + sync
        rows.append(
            {
                "workers": n,
                "nodes": 1,
                "global_batch": REPLAN_B,
                "local_batch": REPLAN_B // n,
                "compute_time_s": comp,
                "sync_time_s": sync,
                "step_time_s": step,
                "step_time_lo_s": step - 0.002,
                "step_time_hi_s": step + 0.005,
                "steps_per_epoch": spe,
                "epochs": 20,
                "train_time_s": 20 * spe * step,
                "train_time_lo_s": 20 * spe * (step - 0.002),
                "train_time_hi_s": 20 * spe * (step + 0.005),
                "cost": 20 * spe * step * n,
                "mem_bytes": 1e6,
                "feasible": True,
                "probe_status": "ok",
            }
        )
    return pd.DataFrame(rows)


def replan_config(objective="time"):
    from tula import config

    return config.from_dict(
        {
            "workload": {"epochs": 20},
            "grid": {"workers": [1, 2], "batch_min": 64, "batch_max": 64},
            "objective": objective,
            "cluster": {"workers_per_node": 2},
        }
    )


def drift_entry(observed, epochs_done=2.0):
    return {
        "observed_s": observed,
        "epochs_done": epochs_done,
        "reason": f"sync {1e3 * observed:.1f} ms vs predicted 5.0 ms",
    }
