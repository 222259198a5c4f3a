"""Fault injection specs (tula.faults): parsed, matched by place and batch, and refused with a
clear message when malformed."""

import pytest
import torch

from tula import faults


def test_fault_specs_parse_and_bad_ones_name_the_problem():
    fs = faults.parse("oom:step=12,rank=1,batch=128; signal:step=5,sig=USR2;truncate:step=10;oom:step=3,where=eval")
    assert [f.kind for f in fs] == ["oom", "signal", "truncate", "oom"] and fs[0].batch == 128 and fs[1].sig == "USR2"
    assert (fs[0].where, fs[3].where) == ("forward", "eval")
    fired = set()
    faults.maybe_oom(fs, "eval", 12, 1, 128, fired)  # another place: no fault
    faults.maybe_oom(fs, "forward", 12, 1, 64, fired)  # another batch: no fault
    with pytest.raises(torch.OutOfMemoryError, match="injected by .* in forward at step 12 on rank 1"):
        faults.maybe_oom(fs, "forward", 12, 1, 128, fired)
    faults.maybe_oom(fs, "forward", 12, 1, 128, fired)  # once per process
    for bad, msg in [("boom:step=1", "unknown fault kind"), ("oom:rank=1", "needs step"),
                     ("signal:step=1,sig=KILL", "sig="), ("oom:step=x", "integers"), ("oom:step=1,when=2", "bad field"),
                     ("oom:step=1,where=loss", "where='loss'.*forward, backward, refresh, eval, checkpoint")]:  # fmt: skip
        with pytest.raises(ValueError, match=msg):
            faults.parse(bad)
