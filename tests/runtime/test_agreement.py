"""Rank agreement (tula.runtime.group.agreement): in two real gloo processes, one all-reduce tells
every rank which ranks failed and carries a payload along, summed or maxed; alone, a process
agrees with itself without a collective."""

import json

import pytest
import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp

from tula.runtime.group.agreement import StepOOM, agree, oom_place


def _ranks(rank: int, world: int, store: str, out: str) -> None:
    torch_dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world
    )
    got = {}
    _, got["none_failed"] = agree(False)
    _, got["rank1_failed"] = agree(rank == 1)
    payload, got["sum_failed"] = agree(
        rank == 0, torch.tensor([1.0 + rank, 10.0], dtype=torch.float64)
    )
    got["sum"] = payload.tolist()
    got["sum_dtype"] = str(payload.dtype)
    # the stop codes: 0 on rank 0, 2 on rank 1
    stop, _ = agree(False, torch.tensor([float(rank * 2)]), op="max")
    got["max"] = stop.tolist()
    torch_dist.barrier()
    torch_dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as fh:
        json.dump(got, fh)


@pytest.mark.slow
def test_every_rank_learns_who_failed_and_the_reduced_payload(tmp_path):
    out = str(tmp_path / "got")
    mp.spawn(_ranks, args=(2, str(tmp_path / "store"), out), nprocs=2, join=True)
    got = [json.loads(open(f"{out}.{r}").read()) for r in (0, 1)]
    assert (
        got[0]
        == got[1]
        == {
            "none_failed": [],
            "rank1_failed": [1],
            "sum_failed": [0],
            "sum": [3.0, 20.0],
            "sum_dtype": "torch.float64",
            "max": [2.0],
        }
    )


def test_one_process_agrees_with_itself_without_a_collective():
    payload = torch.tensor([4.0])
    assert agree(False, payload) == (payload, []) and agree(True) == (None, [0])


def test_the_place_of_an_out_of_memory_error_in_words():
    assert [oom_place(w, 12) for w in ("forward", "backward", "refresh", "eval", "checkpoint")] == [
        "in the forward pass of step 12",
        "in the backward pass of step 12",
        "in AGS's factor refresh of step 12",
        "in evaluation after step 12",
        "while writing the checkpoint of step 12",
    ]
    e = StepOOM([1], "CUDA out of memory", where="refresh")
    assert (e.ranks, e.message, e.where, str(e)) == (
        [1],
        "CUDA out of memory",
        "refresh",
        "CUDA out of memory",
    )
