"""How much of tula.model's arithmetic do the unit tests pin down? cosmic-ray mutates
src/tula/model/ in a copy of this tree (one change at a time: + for -, < for <=, 1.0 for 2.0,
`not` added, ...) and runs tests/model/ against each mutant: a mutant the tests fail on is
killed, one they pass on survived. The score is killed / (killed + survived).

    .venv/bin/pip install -e '.[bench]'                   # cosmic-ray, coverage
    .venv/bin/python bench/mutation.py --sample 0.05     # 278 of 5,533 mutants: ~3 h here
    .venv/bin/python bench/mutation.py --module pricing  # every mutant of one module
    .venv/bin/python bench/mutation.py --tally /tmp/mutation_XXXX   # count a stopped run
    .venv/bin/python bench/mutation.py --recheck /tmp/tula-mutation.json  # survivors again

Operators kept: the arithmetic four among themselves, comparisons, and/or, not, True/False,
numbers, loops and decorators. Left out: replacing + - * / by a bitwise operator, //, % or **
(on this float code they raise or are killed on import; they would only raise the score).
Each mutant runs only the tests that can see it (bench/mutation_lines.py): a first pass of
tests/model under coverage (~90 s) records which tests run each line, and a mutant runs the
tests that ran its changed lines (-x: the first failure kills it). A line run at import (a
constant, a default argument) can reach any test: such a mutant runs its own module's test
file first and, if that passes, the rest of tests/model with two workers, as every mutant did
before. Skipping a test that never runs the changed line cannot change a verdict;
--recheck --all-tests runs all of tests/model and so checks a run's survivors the slow way.
A killed mutant costs seconds, a targeted survivor a few seconds, an import-time survivor the
whole of tests/model (~40 s on 2 cores). A mutant in a type annotation (never evaluated:
equivalent) is set aside before it runs; each cost a whole run of tests/model before. The
mutants run in random order: a run stopped part-way (--tally) is a smaller random sample of
the same kind.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from breaks import copy_tree

LEFT_OUT = [r"core/ReplaceBinaryOperator_.*_(RShift|LShift|BitOr|BitAnd|BitXor|FloorDiv|Mod|Pow)$"]

# the test command: the mutated module is the one that differs from the pristine copy
RUNNER = """#!/bin/bash
cd "$(dirname "$0")"
own=""
for f in src/tula/model/*.py; do
  cmp -s "$f" "../pristine/$f" || own="tests/model/test_$(basename "$f")"
done
py=(env PYTHONPATH="$PWD/src" .venv/bin/python -m pytest -q -p no:cacheprovider -o addopts=)
if [ -f ../lines.json ] && [ -z "$TULA_MUTATION_ALL" ]; then
  sel=$(.venv/bin/python bench/mutation_lines.py select . ../pristine ../lines.json) || sel=ALL
  [ -z "$sel" ] && exit 0  # no line changed: the mutant is the module itself
  if [ "$sel" != ALL ]; then
    mapfile -t ids <<< "$sel"
    workers=0; [ "${#ids[@]}" -gt 30 ] && workers=2
    exec "${py[@]}" -x -n "$workers" "${ids[@]}"
  fi
fi
if [ -n "$own" ] && [ -f "$own" ]; then "${py[@]}" -x -n 0 "$own" || exit 1; fi
exec "${py[@]}" -x -n 2 tests/model
"""


def config(tree: Path, module: str) -> Path:
    path = tree / "cosmic-ray.toml"
    path.write_text(
        "[cosmic-ray]\n"
        f'module-path = "src/tula/model{"/" + module + ".py" if module else ""}"\n'
        "timeout = 600.0\nexcluded-modules = []\n"
        f'test-command = "bash {tree / "run-tests.sh"}"\n'
        '[cosmic-ray.distributor]\nname = "local"\n'
        "[cosmic-ray.filters.operators-filter]\n"
        f"exclude-operators = {json.dumps(LEFT_OUT)}\n"
    )
    return path


def sample(session: Path, fraction: float, seed: int, tree: Path) -> int:
    """Mark all but a random ``fraction`` of each module's pending mutants as skipped, and
    every mutant in a type annotation (equivalent: :func:`in_annotation`) before it costs a
    run of the tests; the number left to run."""
    from cosmic_ray.work_db import use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(session)) as db:
        by_module: dict[str, list[str]] = {}
        for item in db.pending_work_items:
            m = item.mutations[0]
            if in_annotation((tree / m.module_path).read_text(), *m.start_pos):
                out = "in a type annotation: equivalent, not run"
                db.set_result(
                    item.job_id, WorkResult(output=out, worker_outcome=WorkerOutcome.SKIPPED)
                )
                continue
            by_module.setdefault(str(m.module_path), []).append(item.job_id)
        rng, keep = random.Random(seed), 0
        for module, jobs in sorted(by_module.items()):
            n = max(1, round(fraction * len(jobs))) if fraction < 1 else len(jobs)
            chosen = set(rng.sample(sorted(jobs), n))
            keep += n
            for job in jobs:
                if job not in chosen:
                    db.set_result(
                        job,
                        WorkResult(
                            output="not in the sample", worker_outcome=WorkerOutcome.SKIPPED
                        ),
                    )
    return keep


def in_annotation(source: str, line: int, col: int) -> bool:
    """Whether (line, col) lies in a type annotation: with `from __future__ import annotations`
    (every module of tula.model) an annotation is never evaluated, so a mutant there (``X | None``
    made ``X * None``) is equivalent: no test can kill it."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        notes = [getattr(node, "returns", None), getattr(node, "annotation", None)]
        for note in filter(None, notes):
            start, end = (note.lineno, note.col_offset), (note.end_lineno, note.end_col_offset)
            if start <= (line, col) < end:
                return True
    return False


EQUIVALENT = Path(__file__).with_name("mutation_equivalent.toml")


def mutated_line(diff: str) -> str:
    """The line a mutant's diff adds, its runs of blanks made one (how the equivalent list
    names it)."""
    added = [x[1:] for x in diff.splitlines() if x.startswith("+") and not x.startswith("+++")]
    return " ".join(" ".join(added).split())


def equivalent(m, diff: str, tree: Path, listed: set[tuple[str, str, str]]) -> str:
    """Why no test can kill a mutant: "equivalent" (in a type annotation), "listed" (in
    bench/mutation_equivalent.toml, with its reason), or "" (a test could)."""
    if in_annotation((tree / m.module_path).read_text(), *m.start_pos):
        return "equivalent"
    key = (Path(m.module_path).name, m.operator_name.split("/")[-1], mutated_line(diff))
    return "listed" if key in listed else ""


def listed_equivalent() -> set[tuple[str, str, str]]:
    """(module, operator, mutated line) of each mutant bench/mutation_equivalent.toml shows to
    be equivalent, each with its reason there."""
    import tomllib

    got = tomllib.loads(EQUIVALENT.read_text())["equivalent"]
    return {(e["module"], e["operator"], " ".join(e["mutated"].split())) for e in got}


def tally(session: Path, tree: Path) -> dict:
    """Killed, survived and equivalent mutants of a session, per module: equivalent are those in a
    type annotation and those bench/mutation_equivalent.toml lists with the reason."""
    from cosmic_ray.work_db import use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    per: dict[str, dict[str, int]] = {}
    survivors, listed = [], listed_equivalent()
    with use_db(str(session)) as db:
        for item, result in db.completed_work_items:
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                continue
            m = item.mutations[0]
            name = Path(m.module_path).name
            row = per.setdefault(name, dict(killed=0, survived=0, equivalent=0, listed=0, other=0))
            if result.worker_outcome != WorkerOutcome.NORMAL:
                row["other"] += 1  # the mutant did not run (abnormal): neither side
            elif result.test_outcome != TestOutcome.SURVIVED:
                row["killed"] += 1  # failed tests, an error or a timeout
            elif why := equivalent(m, "".join(result.diff or ""), tree, listed):
                row[why] += 1
            else:
                row["survived"] += 1
                survivors.append(
                    {
                        "module": name,
                        "path": str(m.module_path),
                        "operator_name": m.operator_name,
                        "line": m.start_pos[0],
                        "operator": m.operator_name.split("/")[-1],
                        "occurrence": m.occurrence,
                        "diff": "".join(result.diff or ""),
                    }
                )
    k = sum(r["killed"] for r in per.values())
    s = sum(r["survived"] for r in per.values())
    p = k / max(k + s, 1)
    half = 1.96 * math.sqrt(p * (1 - p) / max(k + s, 1))  # the sample's own binomial 95 %
    listed_n = sum(r["listed"] for r in per.values())
    before = k / max(k + s + listed_n, 1)  # the listed ones counted as survivors, as before
    return dict(
        killed=k,
        survived=s,
        listed=listed_n,
        score=p,
        ci95=half,
        score_listed_as_survivors=before,
        per_module=per,
        survivors=survivors,
    )


def report(got: dict) -> None:
    print(
        f"[mutation] score {got['score']:.1%} ± {got['ci95']:.1%} "
        f"({got['killed']} killed, {got['survived']} survived; equivalent ones left out: "
        f"{got.get('listed', 0)} listed, the rest in annotations); "
        f"{got.get('score_listed_as_survivors', got['score']):.1%} with the listed ones "
        "counted as survivors"
    )
    for mod, r in sorted(got["per_module"].items()):
        print(f"  {mod:22s} " + " ".join(f"{k} {v:3d}" for k, v in r.items()))
    for s in got["survivors"]:
        print(f"--- {s['module']}:{s['line']} {s['operator']}\n{s['diff']}")


def workspace(prefix: str) -> tuple[Path, Path]:
    """A scratch directory with two copies of this tree: ``tree``, where mutants are made and
    the tests run (RUNNER in it), and ``pristine``, what RUNNER compares with."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    tree = copy_tree(base / "tree")
    copy_tree(base / "pristine")
    (tree / "run-tests.sh").write_text(RUNNER)
    return base, tree


def lines_map(tree: Path, out: Path) -> None:
    """Which tests run each line of tula.model, for RUNNER's choice of tests per mutant
    (bench/mutation_lines.py); the unmutated tree's tests must pass."""
    t0 = time.time()
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    args = [sys.executable, "bench/mutation_lines.py", "build", str(out)]
    r = subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"[mutation] tests/model fails on the unmutated tree:\n{r.stdout[-3000:]}")
    print(f"[mutation] each line's tests recorded in {time.time() - t0:.0f} s", flush=True)


def recheck(survivors_json: Path, all_tests: bool) -> None:
    """Each survivor of an earlier run applied again (cosmic-ray apply) in a copy of this tree
    as it is now, its tests run (those that run its lines, or with ``all_tests`` every test of
    tests/model): killed now, or still surviving."""
    base, tree = workspace("mutation_recheck_")
    if not all_tests:
        lines_map(tree, base / "lines.json")
    cr = Path(sys.executable).parent / "cosmic-ray"
    verdicts: dict[str, int] = {}
    listed = listed_equivalent()
    for s in json.loads(survivors_json.read_text())["survivors"]:
        args = [cr, "apply", s["path"], s["operator_name"], str(s["occurrence"])]
        subprocess.run(args, cwd=tree, check=True)
        was = (base / "pristine" / s["path"]).read_text().splitlines(keepends=True)
        now = tree.joinpath(s["path"]).read_text().splitlines(keepends=True)
        line = mutated_line("".join(difflib.unified_diff(was, now, "a", "b")))
        if line != mutated_line(s["diff"]):
            verdict = "moved (the code changed: not the same mutant)"
        elif (s["module"], s["operator"], line) in listed:
            verdict = "equivalent (listed)"
        else:
            r = subprocess.run(["bash", tree / "run-tests.sh"], capture_output=True)
            verdict = "killed" if r.returncode else "SURVIVES"
        shutil.copy2(base / "pristine" / s["path"], tree / s["path"])
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
        print(f"[mutation] {s['module']}:{s['line']} {s['operator']}: {verdict}", flush=True)
    print("[mutation] survivors now: " + ", ".join(f"{k} {v}" for k, v in verdicts.items()))
    shutil.rmtree(base)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module", default="", help="one module of tula.model (default: all)")
    ap.add_argument("--sample", type=float, default=1.0, help="fraction of each module's mutants")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "tula-mutation.json")
    ap.add_argument("--tally", type=Path, help="only count a session's directory, run or stopped")
    ap.add_argument(
        "--recheck", type=Path, help="a run's --out: its survivors against the tests now"
    )
    ap.add_argument(
        "--all-tests", action="store_true", help="--recheck with every test, not the lines' own"
    )
    a = ap.parse_args()
    if a.recheck:
        return recheck(a.recheck, a.all_tests)
    if a.tally:  # a run stopped part-way: the mutants it ran are a random sample of its own
        got = tally(a.tally / "session.sqlite", a.tally / "pristine")
        a.out.write_text(json.dumps(got, indent=1))
        return report(got)
    base, tree = workspace("mutation_")
    lines_map(tree, base / "lines.json")
    cfg, session = config(tree, a.module), base / "session.sqlite"
    cr = Path(sys.executable).parent
    t0 = time.time()
    subprocess.run([cr / "cosmic-ray", "init", cfg, session], cwd=tree, check=True)
    subprocess.run([cr / "cr-filter-operators", session, cfg], cwd=tree, check=True)
    n = sample(session, a.sample, a.seed, tree)
    print(f"[mutation] {time.strftime('%Y-%m-%d %H:%M')}: {n} mutants to run in {base}", flush=True)
    subprocess.run([cr / "cosmic-ray", "exec", cfg, session], cwd=tree, check=True)
    got = tally(session, base / "pristine")
    got.update(when=time.strftime("%Y-%m-%d %H:%M"), seconds=round(time.time() - t0))
    got["sample"] = a.sample
    a.out.write_text(json.dumps(got, indent=1))
    report(got)
    shutil.rmtree(base)


if __name__ == "__main__":
    main()
