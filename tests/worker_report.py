"""A worker for tests/test_workers.py: writes what torchrun or srun gave it (rank, world size,
thread settings; a worker started by itself finds none: rank 0 of 1) and whether torchrun's
agent started it to <result-dir>/rank<r>.json, or sleeps (``--sleep``) to be killed."""

import argparse
import json
import os
import time

from tula.workers import processes

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--result-dir", required=True)
    p.add_argument("--sleep", type=float, default=0.0)
    a = p.parse_args()
    time.sleep(a.sleep)
    rank = int(os.environ.get("RANK", 0))
    processes.result_path(a.result_dir, rank).write_text(
        json.dumps(
            {
                "rank": rank,
                "world": int(os.environ.get("WORLD_SIZE", 1)),
                "agent": "TORCHELASTIC_RUN_ID" in os.environ,
                "omp": os.environ["OMP_NUM_THREADS"],
                "unbuffered": os.environ["PYTHONUNBUFFERED"],
                "pid": os.getpid(),
            }
        )
    )
