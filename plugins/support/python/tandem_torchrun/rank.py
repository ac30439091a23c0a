"""The loop of one rank under torchrun: ``main(trainer_cls)``.

Configuration comes from the environment the plugin sets: ``TANDEM_TORCHRUN_CONFIG`` (JSON:
model_path, run_dir, device, options, threads, collective_timeout_s), ``TANDEM_TORCHRUN_ADDR``
and ``TANDEM_TORCHRUN_TOKEN`` (rank 0's control channel). Rank 0 receives each request and
broadcasts it; every rank runs ``trainer.op_<op>(**args)``; the ranks' errors are gathered so
a failure on any rank becomes one reply naming the rank, with the last lines of its traceback.
"""

import datetime
import json
import os
import traceback

TRACE_LINES = 12


def _error(exc, rank):
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    lines = "".join(tb).rstrip().splitlines()[-TRACE_LINES:]
    return {
        "kind": type(exc).__name__,
        "message": str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
        "rank": rank,
        "traceback": "\n".join(lines),
    }


def main(trainer_cls):
    """Runs the rank until the plugin asks it to shut down or closes the channel."""
    cfg = json.loads(os.environ["TANDEM_TORCHRUN_CONFIG"])
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])

    import torch
    import torch.distributed as dist

    torch.set_num_threads(max(1, int(cfg.get("threads", 1))))
    backend = "gloo" if cfg["device"] == "cpu" else "nccl"
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        cfg["device"] = f"cuda:{local}"
    timeout = datetime.timedelta(seconds=float(cfg["collective_timeout_s"]))
    dist.init_process_group(backend, timeout=timeout)

    from .channel import Channel, ChannelClosed

    chan = None
    if rank == 0:
        hello = {"hello": "tandem-torchrun", "pid": os.getpid(), "world": world, "torch": torch.__version__}
        chan = Channel(os.environ["TANDEM_TORCHRUN_ADDR"], os.environ["TANDEM_TORCHRUN_TOKEN"], hello)
    trainer = trainer_cls(cfg, rank, world)
    while True:
        msg = None
        if rank == 0:
            try:
                msg = chan.recv()
            except (ChannelClosed, OSError, ValueError):
                msg = {"op": "shutdown", "args": {}}
        box = [msg]
        dist.broadcast_object_list(box, src=0)
        msg = box[0]
        op = msg.get("op")
        if op == "shutdown":
            if rank == 0:
                try:
                    chan.send({"ok": None})
                except OSError:
                    pass
            break
        result, err = None, None
        try:
            fn = getattr(trainer, "op_" + str(op), None)
            if fn is None:
                raise ValueError(f"unknown operation `{op}`")
            result = fn(**msg.get("args", {}))
        except Exception as exc:  # every failure becomes the reply; the worker keeps serving
            err = _error(exc, rank)
        errs = [None] * world
        dist.all_gather_object(errs, err)
        if rank == 0:
            first = next((e for e in errs if e is not None), None)
            chan.send({"error": first} if first else {"ok": result})
    dist.destroy_process_group()
    if chan is not None:
        chan.close()
