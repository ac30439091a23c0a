"""One worker of the `python` environment's pool (plugins/envs/src/python/).

Embedded in the Tandem binary and written to the run directory at start; started as
`python tandem_env_worker.py` with stdin/stdout as the protocol channel (one JSON object a line)
and stderr as its log. User code never sees the protocol's stdout: fd 1 is pointed at stderr
before anything is imported.

Requests (one line each) and answers:
- {"op": "init", "path": [...], "memory_mb": int|null, "cpu_s": int|null,
   "reward": "module:function" | null, "env": {"class": "module:Class", "kwargs": {...}} | null}
  -> {"ok": {"kind": "verl"|"verl_async"|"trl"|"env", "describe": {...}|null}} | {"error": ...}
- {"op": "score", "samples": [{"item": {...}, "completion": {...}}, ...]}
  -> lines {"at": k, "results": [entry, ...]} (results of samples k, k+1, ...; one line per call
     of the user function), or {"at": k, "error": "..."} (every sample from k failed), then
     {"done": true}. An entry is {"value": v, "components": {...}}, {"none": true},
     {"nonfinite": "nan"} or {"error": "..."}.
- {"op": "item", "split": str, "index": int} -> {"item": {...}} | {"error": "..."}

Limits are set here before user code is imported: RLIMIT_AS from memory_mb; cpu_s is a per-call
CPU budget (RLIMIT_CPU's soft limit moved before each call; SIGXCPU raises CpuLimitExceeded).
A watchdog thread exits the worker when its parent (the Tandem process) is gone.
"""

import asyncio
import importlib
import inspect
import json
import math
import os
import resource
import signal
import sys
import threading
import time
import traceback

PROTO = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
os.dup2(2, 1)
sys.stdout = sys.stderr

VERL = ("data_source", "solution_str", "ground_truth", "extra_info")
LOOP = asyncio.new_event_loop()
STATE = {"cpu_s": None}


class CpuLimitExceeded(Exception):
    """The call used more CPU time than the pool's cpu_s."""


def send(obj):
    PROTO.write(json.dumps(obj, allow_nan=False) + "\n")
    PROTO.flush()


def describe_exc(e):
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}".rstrip(": ").rstrip()


def watchdog(parent):
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(70)


def on_xcpu(_signum, _frame):
    raise CpuLimitExceeded(f"the call used more than {STATE['cpu_s']} s of CPU time")


def set_limits(memory_mb, cpu_s):
    if memory_mb:
        limit = int(memory_mb) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if cpu_s:
        STATE["cpu_s"] = int(cpu_s)
        signal.signal(signal.SIGXCPU, on_xcpu)


def arm_cpu():
    """Moves RLIMIT_CPU's soft limit to cpu_s past the CPU time used so far."""
    if not STATE["cpu_s"]:
        return
    r = resource.getrusage(resource.RUSAGE_SELF)
    used = math.ceil(r.ru_utime + r.ru_stime)
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    resource.setrlimit(resource.RLIMIT_CPU, (used + STATE["cpu_s"], hard))


def disarm_cpu():
    if STATE["cpu_s"]:
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))


def call(fn, *args, **kwargs):
    """Calls fn (sync or async) under the CPU budget."""
    arm_cpu()
    try:
        out = fn(*args, **kwargs)
        if inspect.isawaitable(out):
            out = LOOP.run_until_complete(out)
        return out
    finally:
        disarm_cpu()


def load(target, what):
    module, sep, name = target.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"{what} `{target}` is not `module:name`")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


class Raised:
    """A sample's exception inside a batched answer (async verl)."""

    def __init__(self, e):
        self.e = e


def entry(v, what="returned"):
    """One user value as a protocol entry."""
    if isinstance(v, Raised):
        return {"error": describe_exc(v.e)}
    if v is None:
        return {"none": True}
    components = {}
    if isinstance(v, dict):
        key = "value" if "value" in v else "score" if "score" in v else None
        if key is None:
            return {"error": f"{what} a dict with neither `score` nor `value`: {sorted(v)[:6]}"}
        comps = v.get("components")
        extra = comps if isinstance(comps, dict) else {
            k: x for k, x in v.items() if k not in (key, "components")
        }
        for k, x in extra.items():
            if isinstance(x, (int, float)):
                x = float(x)
                if not math.isfinite(x):
                    return {"nonfinite": f"{x} in component `{k}`"}
                components[str(k)] = x
        v = v[key]
        if v is None:
            return {"none": True}
    if isinstance(v, bool):
        v = float(v)
    try:
        x = float(v)
    except (TypeError, ValueError):
        return {"error": f"{what} {type(v).__name__} {str(v)[:60]!r}, not a number"}
    if not math.isfinite(x):
        return {"nonfinite": str(x)}
    return {"value": x, "components": components}


def conversational(item):
    return bool(item.get("messages"))


class Reward:
    """A reward function with verl's or TRL's signature."""

    def __init__(self, fn):
        self.fn = fn
        sig = inspect.signature(fn)
        self.params = sig.parameters
        self.var_kw = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
        if "solution_str" in self.params:
            self.kind = "verl_async" if inspect.iscoroutinefunction(fn) else "verl"
        elif "completions" in self.params:
            self.kind = "trl"
        else:
            raise TypeError(
                f"cannot tell the signature of {fn.__name__}{sig}: expected verl's "
                "(data_source, solution_str, ground_truth, extra_info=None) or TRL's "
                "(prompts, completions, **kwargs)"
            )

    async def gather(self, kws):
        """An async verl function over a chunk: every sample concurrently on the event loop."""

        async def one(kw):
            try:
                return await self.fn(**kw)
            except Exception as e:  # noqa: BLE001
                return Raised(e)

        return list(await asyncio.gather(*(one(kw) for kw in kws)))

    def wants(self, name):
        return name in self.params or self.var_kw

    def verl_kwargs(self, s):
        item, comp = s["item"], s["completion"]
        meta = item.get("metadata") or {}
        extra = meta.get("extra_info") if isinstance(meta.get("extra_info"), dict) else meta
        kw = {
            "data_source": item.get("source", ""),
            "solution_str": comp.get("text", ""),
            "ground_truth": item.get("answer", ""),
        }
        if self.wants("extra_info"):
            kw["extra_info"] = extra
        return kw

    def score(self, samples):
        if self.kind == "verl_async":
            batched(lambda: call(self.gather, [self.verl_kwargs(s) for s in samples]), len(samples))
            return
        if self.kind == "verl":
            for k, s in enumerate(samples):
                try:
                    out = entry(call(self.fn, **self.verl_kwargs(s)))
                except Exception as e:  # noqa: BLE001 -- every raise is a failed sample
                    out = {"error": describe_exc(e)}
                send({"at": k, "results": [out]})
            return
        items = [s["item"] for s in samples]
        comps = [s["completion"] for s in samples]
        conv = all(conversational(i) for i in items)
        columns = {
            "prompts": [i.get("messages") if conv else i.get("prompt", "") for i in items],
            "completions": [
                [{"role": "assistant", "content": c.get("text", "")}] if conv else c.get("text", "")
                for c in comps
            ],
            "completion_ids": [c.get("token_ids", []) for c in comps],
            "answer": [i.get("answer", "") for i in items],
            "ground_truth": [i.get("answer", "") for i in items],
            "data_source": [i.get("source", "") for i in items],
            "id": [i.get("id", "") for i in items],
        }
        metas = [i.get("metadata") or {} for i in items]
        for key in sorted({k for m in metas for k in m} - {"prompt", "completion"}):
            columns.setdefault(key, [m.get(key) for m in metas])
        kw = {k: v for k, v in columns.items() if self.wants(k)}
        batched(lambda: call(self.fn, **kw), len(samples))


def batched(run, n):
    try:
        out = run()
    except Exception as e:  # noqa: BLE001
        send({"at": 0, "error": describe_exc(e)})
        return
    if not isinstance(out, (list, tuple)):
        send({"at": 0, "error": f"returned {type(out).__name__}, not a list of {n} rewards"})
        return
    if len(out) != n:
        send({"at": 0, "error": f"returned a list of {len(out)} rewards for {n} completions"})
        return
    send({"at": 0, "results": [entry(v) for v in out]})


class Env:
    """An environment class: Class(seed, held_out, **options)."""

    def __init__(self, cls, kwargs):
        self.obj = call(cls, **kwargs)
        self.kind = "env"

    def describe(self):
        d = call(self.obj.describe)
        if not isinstance(d, dict):
            raise TypeError(f"describe() returned {type(d).__name__}, not a dict")
        return d

    def item(self, split, index):
        it = call(self.obj.item, split, index)
        if not isinstance(it, dict):
            raise TypeError(f"item() returned {type(it).__name__}, not a dict")
        return it

    def score(self, samples):
        items = [s["item"] for s in samples]
        comps = [s["completion"] for s in samples]
        batched(lambda: call(self.obj.score, items, comps), len(samples))


def init(msg):
    for p in reversed(msg.get("path") or []):
        if p not in sys.path:
            sys.path.insert(0, p)
    set_limits(msg.get("memory_mb"), msg.get("cpu_s"))
    if msg.get("reward"):
        return Reward(load(msg["reward"], "reward"))
    env = msg.get("env") or {}
    return Env(load(env.get("class", ""), "class"), env.get("kwargs") or {})


def main():
    threading.Thread(target=watchdog, args=(os.getppid(),), daemon=True).start()
    target = None
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg.get("op")
        try:
            if op == "init":
                target = init(msg)
                desc = target.describe() if target.kind == "env" else None
                send({"ok": {"kind": target.kind, "describe": desc}})
            elif op == "score":
                target.score(msg["samples"])
                send({"done": True})
            elif op == "item":
                send({"item": target.item(msg["split"], int(msg["index"]))})
            else:
                send({"error": f"unknown op {op!r}"})
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            send({"error": describe_exc(e)})


if __name__ == "__main__":
    main()
