"""What the benchmark scripts share: this checkout's workflow in a scratch directory, Snakemake
and `tula` run with this environment (a failure stops the benchmark with the end of its
log), and the tests' image-folder generator. Run every benchmark with the project's Python
(`.venv/bin/python bench/<name>.py`), where Tula is installed."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def env(python: Path | None = None, **extra: str) -> dict[str, str]:
    """This environment with ``python``'s bin/ (default: this Python's) first on PATH, where
    `tula`, `snakemake` and `torchrun` are; ``extra`` variables added."""
    bindir = Path(python or sys.executable).parent
    return {**os.environ, "PATH": str(bindir) + os.pathsep + os.environ["PATH"], **extra}


def python_on(src: str | Path | None, code: str, *args: str) -> str:
    """What ``python -c code args`` prints with checkout ``src``'s package first on the path
    (None: this checkout's, as installed); exits naming the checkout where it fails."""
    extra = {"PYTHONPATH": str(src)} if src else {}
    r = subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**os.environ, **extra},
        capture_output=True,
        text=True,
    )
    return _or_exit(r, f"{src or 'this checkout'}").stdout


def copy_workflow(dest: Path, root: Path = ROOT) -> Path:
    """The workflow of checkout ``root`` (Snakefile, rules, envs, workflow/; not its results)
    in ``dest``, which is emptied first."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for part in ("Snakefile", "rules", "envs", "workflow"):
        src = root / part
        shutil.copytree(src, dest / part) if src.is_dir() else shutil.copy(src, dest / part)
    return dest


def _or_exit(r: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if r.returncode != 0:
        sys.exit(f"{what} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def snakemake(
    workdir: Path,
    *args: str,
    cores: int = 2,
    fresh: bool = False,
    extra_env: dict | None = None,
    python: Path | None = None,
) -> float:
    """`snakemake --cores N ARGS` in ``workdir`` (``fresh``: from empty results; ``python``: the
    environment to run it in); its wall time in seconds. Exits with the end of its log when it
    fails."""
    if fresh:
        shutil.rmtree(workdir / "results", ignore_errors=True)
        shutil.rmtree(workdir / ".snakemake", ignore_errors=True)
    t0 = time.perf_counter()
    r = subprocess.run(
        ["snakemake", "--cores", str(cores), *args],
        cwd=workdir,
        env=env(python, **(extra_env or {})),
        capture_output=True,
        text=True,
    )
    _or_exit(r, f"snakemake {' '.join(args)} in {workdir}")
    return time.perf_counter() - t0


def tula(
    *args: str, cwd: Path | None = None, extra_env: dict | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    """`tula ARGS`; with ``check``, exits with the end of its log when it fails."""
    r = subprocess.run(
        ["tula", *args], cwd=cwd, env=env(None, **(extra_env or {})), capture_output=True, text=True
    )
    return _or_exit(r, f"tula {' '.join(args)}") if check else r


def tests_helper(name: str, module: str = "conftest") -> Any:
    """A helper of tests/<module>.py (conftest's ``make_image_folder``: the Pillow image-folder
    generator; bounds': the suite's numeric bounds), loaded from its file."""
    spec = importlib.util.spec_from_file_location(
        f"tula_tests_{module}", ROOT / "tests" / f"{module}.py"
    )
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return getattr(loaded, name)


@contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """A git worktree of this checkout at ``rev`` (the code before, for a side-by-side run),
    removed after."""
    with tempfile.TemporaryDirectory(prefix="before-") as tmp:
        tree = Path(tmp) / "before"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), rev],
            check=True,
        )
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)])
