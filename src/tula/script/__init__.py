"""Tula inside your own training script (``workload.script``): a few lines, and Tula probes,
plans and trains *your* loop.

.. code-block:: python

    import tula.script

    run = tula.script.attach(local_batch=args.batch_size, epochs=args.epochs, lr=args.lr)
    ...  # init_process_group, the model in DDP, the optimizer, the loader at run.local_batch
    run.keep(model=model, optimizer=opt, scheduler=sched)  # checkpointed; put back on resume
    train_step = run.step(train_step)  # timed; a probe also times it under DDP's no_sync()
    for epoch in run.epochs():
        sampler.set_epoch(epoch)
        for x, y in run.batches(loader):  # a resumed epoch skips what it stepped already
            loss = train_step(x, y)
        run.epoch_end(loss=..., metric=..., test_loss=..., test_metric=...)

Without Tula (``torchrun train.py``) every call passes through and ``run.local_batch`` is the
script's own. Under Tula the run is a check, the memory probe, a timing probe (which ends the
process once it has measured what it needs) or the production job (checkpoints, requeue,
final.json): :mod:`tula.script.run` says what each call does."""

from tula.script.run import Run, attach, current

__all__ = ["Run", "attach", "current"]
