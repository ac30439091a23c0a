"""The W&B sidecar of a Tandem run: the `wandb` package driven over stdin/stdout.

Requests are JSON lines on stdin, one answer line each on stdout ({"ok": true, ...} or
{"ok": false, "error": "..."}); everything wandb prints goes to stderr.
  {"op": "init", "project", "entity", "group", "name", "mode", "dir", "id", "config"}
  {"op": "log", "rows": [{"step": N, "name": value, ...}, ...]}
  {"op": "finish", "summary": {...}, "exit_code": 0 | 1}
Rows are logged against their `step` field (`define_metric("*", step_metric="step")`), so a
step sent again after a resume is a second point at that step, never a refused one.
"""

import json
import sys


def main():
    out = sys.stdout
    sys.stdout = sys.stderr
    import wandb

    run = None
    for raw in sys.stdin:
        req = json.loads(raw)
        try:
            op = req["op"]
            if op == "init":
                settings = wandb.Settings(
                    console="off", silent=True, x_disable_stats=True, init_timeout=60
                )
                run = wandb.init(
                    project=req["project"],
                    entity=req.get("entity"),
                    group=req.get("group"),
                    name=req.get("name"),
                    mode=req["mode"],
                    dir=req["dir"],
                    id=req["id"],
                    resume="allow",
                    config=req.get("config") or {},
                    settings=settings,
                )
                run.define_metric("step")
                run.define_metric("*", step_metric="step")
                answer = {"ok": True, "id": run.id}
            elif op == "log":
                for row in req["rows"]:
                    run.log(row)
                answer = {"ok": True}
            elif op == "finish":
                if run is not None:
                    run.summary.update(req.get("summary") or {})
                    run.finish(exit_code=req.get("exit_code", 0))
                    run = None
                answer = {"ok": True}
            else:
                answer = {"ok": False, "error": f"unknown op {op!r}"}
        except Exception as e:  # noqa: BLE001 - every failure is one answer line
            first = (str(e).strip().splitlines() or [""])[0]
            answer = {"ok": False, "error": f"{type(e).__name__}: {first}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
