#!/bin/bash
# One probe job of the default at N workers, alone, on the inputs of an earlier run, with a
# checkout's src/ first on PYTHONPATH: its wall, then each point's record (wall, the point's
# own wall, start-up, timing, step). For a before/after of a change in the probe's path,
# alternated on the same snapshot and memory probe (the DAG's probe jobs also wait on the rest
# of the DAG and on each other):
#
#   for i in 1 2 3 4; do bash bench/probe_job_alone.sh /tmp/before/src; bash bench/probe_job_alone.sh src; done
#
# Needs .snakemake/tula/config.json and results/memory_probe.json from a `make run` of this
# checkout. N: $2 (default 2). Each run probes into a fresh folder, removed after.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src=$(cd "$1" && pwd)
n=${2:-2}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
mkdir -p "$d/N$n"
cd "$root"
t0=$(date +%s.%N)
PYTHONPATH="$src" "$root/.venv/bin/tula" probe --config .snakemake/tula/config.json \
  --workers "$n" --memory-probe results/memory_probe.json --job "$d/N$n/job.json" > "$d/log" 2>&1
t1=$(date +%s.%N)
"$root/.venv/bin/python" - "$src" "$d/N$n" "$t0" "$t1" <<'PY'
import json, sys
from pathlib import Path
src, folder, t0, t1 = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
print(f"{src}: probe job wall {t1 - t0:.2f} s")
for f in sorted(folder.glob("B*.json")):
    r = json.loads(f.read_text())
    print(
        f"  {f.stem}: wall {r['wall_s']:.2f} s, point {r['point_wall_s']:.2f} s, start-up "
        f"{r.get('startup_time_s') or 0:.2f} s, timing {r['timing_s']:.2f} s, "
        f"step {1e3 * r['step_time_s']:.2f} ms ({r.get('timing_stopped_by')})"
    )
PY
