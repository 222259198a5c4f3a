"""Step-time overhead of TulaOptimizer (AGS) against the bare optimizer it wraps.

Same model, data and base optimizer (SGD, momentum 0.9); one process, one thread. Blocks
of STEPS steps alternate between the two (interleaved, so drift hits both alike); the
figure is the median over ROUNDS of the per-round ratio of median step times. The AGS
arm runs with scales set and every step outside the sensitive phase (delta = inf), so
every step pays the norm, the Delta test and the element-wise multiply. The cost of one
refresh (a forward/backward on the reference sub-batch) is timed separately.

    .venv/bin/python bench/ags_overhead.py [--model small_cnn] [--batch 256] [--rounds 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tula import config
from tula.runtime.input import data
from tula.runtime.step.nets import build_model
from tula.runtime.train.optim import TulaOptimizer
from tula.runtime.train.refresh import refresh_scales


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small_cnn")
    ap.add_argument("--dataset", default="mnist1d")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(1)
    ds = data.load_config(
        config.from_dict({"workload": {"dataset": a.dataset, "mnist1d_samples": 4000}})
    )
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(0)

    def arm(wrapped: bool):
        torch.manual_seed(0)
        m = build_model(a.model, ds.input_shape, ds.num_classes)
        base = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        if not wrapped:
            return m, base
        opt = TulaOptimizer(base, mode="ags", delta=float("inf"), s_max=4.0)
        x, y = ds.train.x[: a.batch], ds.train.y[: a.batch]
        loss_fn(m(x), y).backward()
        refresh_scales(m, opt, loss_fn, x[:32], y[:32])
        return m, opt

    arms = {"bare": arm(False), "ags": arm(True)}

    def block(name: str) -> float:
        m, opt = arms[name]
        times = []
        for _ in range(a.steps):
            idx = torch.randint(0, len(ds.train.x), (a.batch,), generator=gen)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss_fn(m(ds.train.x[idx]), ds.train.y[idx]).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    block("bare"), block("ags")  # warm-up
    ratios, bare_s, ags_s = [], [], []
    for r in range(a.rounds):
        order = ("bare", "ags") if r % 2 == 0 else ("ags", "bare")
        t = {name: block(name) for name in order}
        ratios.append(t["ags"] / t["bare"])
        bare_s.append(t["bare"])
        ags_s.append(t["ags"])
    m, opt = arms["ags"]
    refresh = []
    for _ in range(a.rounds):
        idx = torch.randint(0, len(ds.train.x), (a.batch,), generator=gen)
        opt.zero_grad(set_to_none=True)
        loss_fn(m(ds.train.x[idx]), ds.train.y[idx]).backward()
        t0 = time.perf_counter()
        refresh_scales(m, opt, loss_fn, ds.train.x[idx[:32]], ds.train.y[idx[:32]])
        refresh.append(time.perf_counter() - t0)
    assert opt.counters["scaled"] > 0
    print(
        f"{a.model} on {a.dataset}, batch {a.batch}, {a.rounds} interleaved rounds x {a.steps} "
        "steps"
    )
    print(
        f"median step: bare {1e3 * statistics.median(bare_s):.3f} ms, AGS "
        f"{1e3 * statistics.median(ags_s):.3f} ms"
    )
    q = statistics.quantiles(ratios, n=4)
    print(
        f"AGS / bare step-time ratio: median {statistics.median(ratios):.4f} (IQR "
        f"{q[0]:.4f}-{q[2]:.4f})"
    )
    print(
        f"one refresh (sub-batch 32): median {1e3 * statistics.median(refresh):.3f} ms = "
        f"{statistics.median(refresh) / statistics.median(bare_s):.2f} bare steps"
    )


if __name__ == "__main__":
    main()
