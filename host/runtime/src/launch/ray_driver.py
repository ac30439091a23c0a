"""Tandem's Ray driver: the controller runs it (on a Ray node) to place workers with Ray.

Two commands, each one Ray job (namespace ``tandem``):

``hold ADDRESS NAME STRATEGY BUNDLES_JSON``
    Creates the run's placement group NAME (one bundle per rank, STRATEGY PACK / SPREAD /
    STRICT_PACK / STRICT_SPREAD), prints ``ready`` and the node address of every bundle as one
    JSON line, then holds it until its stdin closes (the controller ends or drops it). The
    group belongs to this job, so it goes with this process, whatever ends it.

``run ADDRESS NAME BUNDLE -- CMD...``
    Starts one actor in bundle BUNDLE of NAME (no resources of its own: the bundle reserved
    them, and a restarted rank shares it with the process it replaces). The actor starts CMD
    with the ``TANDEM_*``/``MALLOC_*``/``NO_COLOR`` variables of this process's environment
    (they travel as a method argument, never on a command line) and dies with it. This process
    copies the worker's output to its stdout (the worker's log on the controller) and ends the
    way the worker ended: its exit status, or the signal that killed it. SIGTERM/SIGINT stop
    the worker first. When the actor or its node dies, it says so and exits 1.
"""

import json
import os
import signal
import socket
import sys
import time

import ray
from ray.util.placement_group import get_placement_group, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

NAMESPACE = "tandem"
FORWARDED = ("TANDEM_", "MALLOC_", "NO_COLOR", "RUST_")


def say(msg):
    print(f"tandem ray driver: {msg}", file=sys.stderr, flush=True)


def connect(address):
    ray.init(
        address=address,
        namespace=NAMESPACE,
        log_to_driver=False,
        logging_level="ERROR",
        configure_logging=False,
    )


@ray.remote(num_cpus=0, max_restarts=0)
class WorkerHost:
    """Runs one worker process on the actor's node and relays its output."""

    def __init__(self):
        self.proc = None
        self.out = bytearray()

    def start(self, cmd, env):
        import ctypes
        import subprocess
        import threading

        libc = ctypes.CDLL("libc.so.6", use_errno=True)

        def die_with_actor():
            # PR_SET_PDEATHSIG: the worker gets SIGKILL when this actor process ends.
            libc.prctl(1, signal.SIGKILL)

        full = dict(os.environ)
        full.update(env)
        self.proc = subprocess.Popen(
            cmd,
            env=full,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_actor,
        )
        self.lock = threading.Lock()

        def pump():
            fd = self.proc.stdout.fileno()
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return
                with self.lock:
                    self.out.extend(chunk)

        self.pump = threading.Thread(target=pump, daemon=True)
        self.pump.start()
        return {"host": socket.gethostname(), "ip": ray.util.get_node_ip_address(), "pid": self.proc.pid}

    def poll(self):
        code = self.proc.poll()
        if code is not None:
            self.pump.join(timeout=5)
        with self.lock:
            out = bytes(self.out)
            self.out.clear()
        return out, code

    def stop(self, sig):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return True


def reachable(address):
    """An explicit head address answers on its GCS port (ray.init would retry for minutes)."""
    if address == "auto" or ":" not in address:
        return True
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
        return True
    except (OSError, ValueError) as e:
        say(f"cannot reach the Ray cluster at {address}: {e} (is `ray start --head` running there?)")
        return False


def hold(address, name, strategy, bundles_json):
    bundles = json.loads(bundles_json)
    if not reachable(address):
        return 1
    connect(address)
    pg = placement_group(bundles, strategy=strategy, name=name)
    ready, _ = ray.wait([pg.ready()], timeout=120)
    if not ready:
        say(f"placement group {name} ({len(bundles)} bundles {bundles}, {strategy}) was not placed within 120 s; "
            "the cluster lacks the resources (see `ray status`)")
        return 1
    table = ray.util.placement_group_table(pg)
    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    where = [nodes.get(table["bundles_to_node_id"][i], "?") for i in range(len(bundles))]
    print("ready " + json.dumps(where), flush=True)
    sys.stdin.read()
    return 0


def run(address, name, bundle, cmd):
    connect(address)
    pg = get_placement_group(name)
    host = WorkerHost.options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=bundle
        )
    ).remote()
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED)}
    info = ray.get(host.start.remote(cmd, env))
    say(f"worker pid {info['pid']} on {info['host']} ({info['ip']}), bundle {bundle} of {name}")

    stopping = []

    def on_signal(sig, _frame):
        stopping.append(sig)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    out = sys.stdout.buffer
    while True:
        if stopping:
            try:
                ray.get(host.stop.remote(signal.SIGTERM), timeout=10)
            except Exception:  # noqa: BLE001 - the actor may already be gone
                pass
            stopping.clear()
        try:
            chunk, code = ray.get(host.poll.remote(), timeout=30)
        except ray.exceptions.GetTimeoutError:
            # A slow answer on a loaded node is not a dead actor: ask again.
            continue
        except Exception as e:  # noqa: BLE001 - any other Ray error here means the actor is gone
            say(f"lost the worker on {info['host']} ({info['ip']}): {type(e).__name__}: {e}")
            return 1
        if chunk:
            out.write(chunk)
            out.flush()
        if code is not None:
            if code < 0:
                # End the way the worker ended: the controller reads the signal from our status.
                sys.stdout.flush()
                if -code not in (signal.SIGKILL, signal.SIGSTOP):
                    signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
                time.sleep(1)
                return 128 - code
            return code
        time.sleep(0.1)


def main(argv):
    if len(argv) == 5 and argv[0] == "hold":
        return hold(*argv[1:])
    if len(argv) >= 6 and argv[0] == "run" and argv[4] == "--":
        return run(argv[1], argv[2], int(argv[3]), argv[5:])
    say("usage: hold ADDRESS NAME STRATEGY BUNDLES_JSON | run ADDRESS NAME BUNDLE -- CMD...")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
