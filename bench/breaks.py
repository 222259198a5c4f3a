"""Does the suite catch what it is for? Each break is applied to a copy of this tree (the files
git tracks or would track, as they are now), the tests that should catch it run there, and a
table says, for each break and each test: caught (the test failed) or not. With --unbroken N
the same tests run N times on the unchanged copy: how often they fail with nothing broken
(the false alarms).

    .venv/bin/python bench/breaks.py                    # every break, ~15 min
    .venv/bin/python bench/breaks.py --only "prediction x1.3,labels shuffled"
    .venv/bin/python bench/breaks.py --unbroken 10      # the false-alarm rate, ~12 min

A break is one exact replacement in one source file (it must match once: a break that no
longer applies is an error, not a pass). Tests run with -n 0, one break after another, so
that the timed runs among them run as `make test` runs them: alone (tests/sharing.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _harness import ROOT

DAG = "tests/test_dag.py::"
BOUNDED = [  # the tests that bound what the default run promises (tests/bounds.py)
    DAG + "test_the_production_job_confirms_its_prediction_within_the_machines_noise",
    DAG + "test_the_prediction_reproduces_the_probes_it_was_fitted_on",
    DAG + "test_a_point_left_out_of_the_fit_is_predicted_within_its_noise",
    DAG + "test_the_default_run_trains_to_its_points_accuracy",
]
# every step predictions.csv holds, and so the choice and the production job's prediction,
# is PerfModel.accumulated's (k = 1 included)
STEP = "src/tula/model/perf.py"
STEP_OLD = "        step = np.maximum(self.model_step_time_s(workers, m) + more, t_in)\n"


@dataclass(frozen=True)
class Break:
    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


def scaled(factor: float) -> Break:
    """Every step the product predicts, scaled by ``factor``."""
    new = STEP_OLD.replace("np.maximum(", f"{factor} * np.maximum(")
    return Break(f"prediction x{factor}", STEP, STEP_OLD, new, tuple(BOUNDED[:3]))


BREAKS = [
    scaled(1.3),
    scaled(0.77),
    Break(
        "labels shuffled",
        "src/tula/runtime/input/data.py",
        '    integer one per batch (its stored bytes kept: :class:`TensorSet`)."""\n',
        '    integer one per batch (its stored bytes kept: :class:`TensorSet`)."""\n'
        "    y_tr = np.random.default_rng(0).permutation(y_tr)\n",
        (BOUNDED[3],),
    ),
    Break(
        "learning rate x0.1",
        "src/tula/model_inputs.py",  # the schedule's LR plan: what sets every step's LR
        "    return LRPlan(\n        t.lr,\n",
        "    return LRPlan(\n        0.1 * t.lr,\n",
        (BOUNDED[3],),
    ),
    Break(
        "a uint8 set standardised twice",
        "src/tula/runtime/input/data.py",
        "        if norm is None or x.is_floating_point():\n",
        "        if norm is None:\n",
        (
            "tests/production/test_trainer.py::test_two_process_training",
            "tests/runtime/test_data.py::"
            "test_a_uint8_set_stays_uint8_and_its_batches_are_standardised_where_they_are",
        ),
    ),
    Break(
        "a probe's sync time dropped",
        "src/tula/runtime/probe/probe_measurement.py",
        '        step_time_s=s["mean"] + extra,\n',
        '        step_time_s=c["mean"] + extra,\n',
        ("tests/stages/test_probe.py::test_two_process_gloo_probe", *BOUNDED[:3]),
    ),
    Break(
        "the memory estimate halved",
        "src/tula/model/memory.py",
        "        return np.maximum(self.fit.predict(local_batch), 0.0)\n",
        "        return 0.5 * np.maximum(self.fit.predict(local_batch), 0.0)\n",
        (
            "tests/model/test_memory.py::test_memory_fit_and_max_feasible_batch_by_hand",
            "tests/stages/test_memprobe.py::"
            "test_memory_probe_gives_b_max_and_the_search_set_stays_below_it",
        ),
    ),
]


def copy_tree(where: Path) -> Path:
    """This tree's files as they are now (tracked, and untracked ones git would not ignore),
    with this tree's .venv linked in."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (where / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, where / f)
    (where / ".venv").symlink_to(ROOT / ".venv")
    return where


def apply(tree: Path, b: Break) -> None:
    path = tree / b.file
    text = path.read_text()
    if text.count(b.old) != 1:
        sys.exit(f"break {b.name!r}: {b.file} holds its text {text.count(b.old)} times, not once")
    path.write_text(text.replace(b.old, b.new))


def run_tests(tree: Path, tests: tuple[str, ...], out: Path) -> dict[str, str]:
    """Each test's outcome in one pytest run in ``tree`` (its own src first on PYTHONPATH)."""
    junit = out.with_suffix(".xml")
    env = dict(
        os.environ,
        PYTHONPATH=str(tree / "src"),
        PATH=f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
    )
    cmd = [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-q"]
    cmd += [f"--junitxml={junit}", *tests]
    with open(out, "w") as log:
        subprocess.run(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    return outcomes(junit)


def outcomes(junit: Path) -> dict[str, str]:
    import xml.etree.ElementTree as ET

    got = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name")
        kids = {c.tag for c in case}
        got[name] = (
            "failed"
            if kids & {"failure", "error"}
            else "skipped"
            if "skipped" in kids
            else "passed"
        )
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated break names")
    ap.add_argument("--unbroken", type=int, default=0, help="runs of the unchanged tree")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="breaks_"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"[breaks] {time.strftime('%Y-%m-%d %H:%M')}, logs in {out}", flush=True)
    rows = []
    if a.unbroken:
        tests = tuple(dict.fromkeys(t for b in BREAKS for t in b.tests))
        tree = copy_tree(Path(tempfile.mkdtemp(prefix="unbroken_")))
        for i in range(a.unbroken):
            got = run_tests(tree, tests, out / f"unbroken_{i}.log")
            failed = sorted(t for t, o in got.items() if o != "passed")
            rows.append(("unbroken", f"run {i + 1}", ", ".join(failed) or "all passed"))
            print(f"[breaks] unbroken run {i + 1}: {rows[-1][2]}", flush=True)
        shutil.rmtree(tree)
    wanted = {w.strip() for w in a.only.split(",") if w.strip()}
    for b in BREAKS if not a.unbroken else []:
        if wanted and b.name not in wanted:
            continue
        tree = copy_tree(Path(tempfile.mkdtemp(prefix="broken_")))
        apply(tree, b)
        t0 = time.time()
        got = run_tests(tree, b.tests, out / f"{b.name.replace(' ', '_')}.log")
        for test in b.tests:
            outcome = got.get(test.rsplit("::", 1)[-1], "not run")
            rows.append((b.name, test, "caught" if outcome == "failed" else outcome))
        caught = any(r[2] == "caught" for r in rows if r[0] == b.name)
        print(
            f"[breaks] {b.name}: {'caught' if caught else 'NOT caught'} ({time.time() - t0:.0f} s)",
            flush=True,
        )
        shutil.rmtree(tree)
    print("\n| break | test | outcome |\n|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | `{r[1].rsplit('::', 1)[-1]}` | {r[2]} |")


if __name__ == "__main__":
    main()
