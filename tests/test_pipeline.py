"""What the Snakemake workflow asks of Tula (tula.pipeline): the config snapshot the jobs read,
each rule's rerun trigger, and the conda environment file."""

import yaml

from conftest import ROOT
from tula import config, pipeline


def test_snapshot_is_rewritten_only_on_change(tmp_path):
    path = tmp_path / "snap.json"
    pipeline.snapshot(config.from_dict({"objective": "time"}), path)
    first = path.stat().st_mtime_ns
    pipeline.snapshot(config.from_dict({"objective": "time"}), path)
    assert path.stat().st_mtime_ns == first
    pipeline.snapshot(config.from_dict({"objective": "cost"}), path)
    assert config.load(path).objective == "cost"


def test_stage_settings_isolate_reruns():
    a = config.from_dict({"pricing": {"per_worker_hour": 1.0}})
    b = config.from_dict({"pricing": {"per_worker_hour": 9.0}})
    assert pipeline.stage_settings(a, "probe") == pipeline.stage_settings(b, "probe")
    assert pipeline.stage_settings(a, "select") != pipeline.stage_settings(b, "select")
    c = config.from_dict({"probe": {"timed_steps": 50}})
    assert pipeline.stage_settings(a, "probe") != pipeline.stage_settings(c, "probe")


def test_conda_env_file_installs_this_checkout_wherever_snakemake_copies_it(tmp_path):
    """Snakemake creates conda environments from a copy of the env file under .snakemake/conda/,
    so `-e ..` must become an absolute path; checked with pip itself from another directory
    (conda cannot be installed here: its packages come from conda-forge, which this machine and
    CI cannot reach)."""
    import subprocess
    import sys

    out = pipeline.conda_env(
        ROOT / "envs" / "tula.yaml", tmp_path / ".snakemake" / "tula" / "conda-env.yaml"
    )
    env = yaml.safe_load(out.read_text())
    (pip,) = [d["pip"] for d in env["dependencies"] if isinstance(d, dict)]
    assert pip == [f"-e {ROOT}"] and "python=3.11" in env["dependencies"]
    copy = tmp_path / ".snakemake" / "conda" / "0123abcd.yaml"  # where Snakemake puts its copy
    copy.parent.mkdir(parents=True)
    copy.write_text(out.read_text())
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            *pip[0].split(),
        ],
        cwd=copy.parent,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and "Would install tula" in r.stdout, r.stdout + r.stderr
    # other pip entries are kept; relative paths resolve from the template's directory
    tpl = tmp_path / "envs" / "t.yaml"
    tpl.parent.mkdir()
    tpl.write_text(
        yaml.safe_dump({"dependencies": ["pip", {"pip": ["numpy>=1", "-e ..", "./vendored"]}]})
    )
    got = yaml.safe_load(pipeline.conda_env(tpl, tmp_path / "o.yaml").read_text())["dependencies"][
        1
    ]["pip"]
    assert got == ["numpy>=1", f"-e {tmp_path}", str(tmp_path / "envs" / "vendored")]
