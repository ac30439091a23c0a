"""Reads what a Tandem run sent to its trackers back with each tracker's own package, and
prints it as one JSON object (the `tracking` tests compare it with metrics.jsonl).

  read_back.py tensorboard DIR       {"scalars": {tag: [[step, value], ...]}, "texts": [tag]}
  read_back.py wandb RUN_DIR         {"runs": [{"id", "history": [row], "config": {key: value}}]}
  read_back.py mlflow URI RUN_ID     {"status", "params", "tags", "metrics": {key: [[step, v]]}}

W&B: wandb 0.31 keeps its offline-file reader in its Go core (wandb-core), not in Python; the
records are read here with the package's own protobuf types (`wandb.proto.wandb_internal_pb2.
Record`) from the LevelDB-log framing of the `.wandb` file (7-byte header, 32 KiB blocks,
records of type full/first/middle/last).
"""

import glob
import json
import os
import struct
import sys


def tensorboard(directory):
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(directory, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    scalars = {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in tags["scalars"]}
    return {"scalars": scalars, "texts": sorted(tags["tensors"])}


def wandb_records(path):
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", f"{path} is not a W&B data file"
    block, pos, buf, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - (pos % block)
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            out.append(buf + chunk)
            buf = b""
    return out


def wandb(run_dir):
    from wandb.proto import wandb_internal_pb2 as pb

    runs = []
    for path in sorted(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))):
        run = {"id": None, "history": [], "config": {}}
        for raw in wandb_records(path):
            rec = pb.Record()
            rec.ParseFromString(raw)
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                run["id"] = rec.run.run_id
                for item in rec.run.config.update:
                    run["config"][item.key] = json.loads(item.value_json)
            elif kind == "config":
                for item in rec.config.update:
                    run["config"][item.key] = json.loads(item.value_json)
            elif kind == "history":
                row = {}
                for item in rec.history.item:
                    key = item.key or "/".join(item.nested_key)
                    row[key] = json.loads(item.value_json)
                run["history"].append(row)
        runs.append(run)
    return {"runs": runs}


def mlflow(uri, run_id):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    run = client.get_run(run_id)
    metrics = {
        key: [[m.step, m.value] for m in client.get_metric_history(run_id, key)]
        for key in run.data.metrics
    }
    return {
        "status": run.info.status,
        "params": run.data.params,
        "tags": run.data.tags,
        "metrics": metrics,
    }


if __name__ == "__main__":
    what, args = sys.argv[1], sys.argv[2:]
    result = {"tensorboard": tensorboard, "wandb": wandb, "mlflow": mlflow}[what](*args)
    sys.stdout.write(json.dumps(result))
