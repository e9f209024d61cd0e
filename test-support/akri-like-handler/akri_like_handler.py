"""A discovery handler that behaves on the wire as Akri's own handlers do.

It speaks the v0 discovery protocol through gRPC code generated at start
from steward's vendored proto by grpc_tools.protoc (nothing of steward's
Rust types is involved), and reproduces what Akri's handlers do around it
(see README.md next to this file):

* it serves `v0.DiscoveryHandler` on its own unix socket, then registers
  with the agent once (`v0.Registration/RegisterDiscoveryHandler`);
* each `Discover` answers its response headers at once and then polls the
  devices every INTERVAL seconds; it sends the device list only when it
  changed since the last poll, starting from an empty list: while nothing
  matches it sends nothing at all;
* before each poll it checks whether the stream it serves is still open;
  when it is closed (or a send fails) it registers again, once per closed
  stream, and ends that stream's loop;
* a registration the agent cannot be reached for is retried every
  RETRY seconds; a registration the agent refuses ends the process (exit 2).

Devices come from a file, one device id per line; a missing or empty file
means nothing matches. The discovery details are `key: value` lines; the
only key is `prefix` (only ids starting with it match); anything else is
refused with INVALID_ARGUMENT, as Akri's handlers refuse details they cannot
parse.

What it did is kept in a JSON file (--counters), rewritten atomically on
every change: registrations (accepted), register_attempts, discover_calls,
invalid_details, streams_closed (closed streams it noticed), open_streams,
responses_sent.

Exit status: 2 registration refused, 3 grpcio or grpcio-tools missing
("NOGRPC ..." on stdout), 4 stub generation failed.
"""

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures

try:
    import grpc
    import grpc_tools  # noqa: F401  (only checked here; run through python3 -m)
except ImportError as e:
    print(f"NOGRPC {e}", flush=True)
    sys.exit(3)


def generate_stubs(proto):
    """Generates the v0 stubs from `proto` into a fresh directory, imports
    them and removes the directory (the modules stay loaded; the handler is
    ended with a signal, so nothing left on disk would be cleaned later)."""
    out = tempfile.mkdtemp(prefix="akri-like-stubs-")
    try:
        return _generate_into(out, proto)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _generate_into(out, proto):
    proto_dir, proto_file = os.path.split(os.path.abspath(proto))
    result = subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc",
            f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}",
            proto_file,
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        print(f"protoc failed: {result.stderr}", file=sys.stderr, flush=True)
        sys.exit(4)
    sys.path.insert(0, out)
    module = os.path.splitext(proto_file)[0]
    pb2 = __import__(f"{module}_pb2")
    pb2_grpc = __import__(f"{module}_pb2_grpc")
    return pb2, pb2_grpc


class Counters:
    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.values = {
            "registrations": 0,
            "register_attempts": 0,
            "discover_calls": 0,
            "invalid_details": 0,
            "streams_closed": 0,
            "open_streams": 0,
            "responses_sent": 0,
            "pid": os.getpid(),
        }
        self._write()

    def add(self, name, delta=1):
        with self.lock:
            self.values[name] += delta
            self._write()

    def _write(self):
        if not self.path:
            return
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.values, f)
        os.replace(tmp, self.path)


def log(msg):
    print(f"akri-like-handler: {msg}", file=sys.stderr, flush=True)


def read_devices(path):
    try:
        with open(path) as f:
            return [line.strip() for line in f if line.strip()]
    except FileNotFoundError:
        return []


def parse_details(text):
    """`key: value` lines; returns the prefix or raises ValueError."""
    prefix = ""
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"line {n}: expected `key: value`")
        key, value = key.strip(), value.strip().strip("\"'")
        if key != "prefix":
            raise ValueError(f"line {n}: unknown key {key!r}")
        prefix = value
    return prefix


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--registration-socket", required=True, help="the agent's registration socket")
    p.add_argument("--name", required=True, help="handler name Configurations ask for")
    p.add_argument("--shared", action="store_true", help="devices visible from several nodes")
    p.add_argument("--socket", required=True, help="this handler's own unix socket")
    p.add_argument("--devices", required=True, help="file of device ids, one a line")
    p.add_argument("--interval", type=float, default=10.0, help="device poll interval, seconds (Akri: 10)")
    p.add_argument("--retry", type=float, default=10.0, help="registration retry when the agent is unreachable, seconds")
    p.add_argument("--counters", help="JSON file of counters, rewritten on each change")
    p.add_argument("--proto", required=True, help="the v0 discovery proto to generate stubs from")
    p.add_argument("--authority", help="`:authority` for the registration channel (e.g. localhost, as a tonic client sends)")
    p.add_argument("--lazy-headers", action="store_true",
                   help="hold the response headers back until the first device list (gRPC C-core's default)")
    args = p.parse_args()

    pb2, pb2_grpc = generate_stubs(args.proto)
    counters = Counters(args.counters)
    reregister = queue.Queue()

    class Handler(pb2_grpc.DiscoveryHandlerServicer):
        def Discover(self, request, context):
            counters.add("discover_calls")
            try:
                prefix = parse_details(request.discovery_details)
            except ValueError as e:
                counters.add("invalid_details")
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid discovery details: {e}")
            if not args.lazy_headers:
                # A tonic server (Akri's handlers) sends the response
                # headers as soon as discover() returns its stream.
                context.send_initial_metadata(())
            counters.add("open_streams")
            closed = False

            def on_closed(why):
                nonlocal closed
                if closed:
                    return
                closed = True
                counters.add("open_streams", -1)
                counters.add("streams_closed")
                log(f"discovery stream closed ({why}); registering again")
                reregister.put(why)

            previous = []
            try:
                while True:
                    if not context.is_active():
                        on_closed("receiver dropped")
                        return
                    devices = [d for d in read_devices(args.devices) if d.startswith(prefix)]
                    if devices != previous:
                        previous = devices
                        response = pb2.DiscoverResponse(devices=[
                            pb2.Device(id=d, properties={"AKRI_LIKE_ID": d}) for d in devices
                        ])
                        counters.add("responses_sent")
                        yield response
                    time.sleep(args.interval)
            except GeneratorExit:
                on_closed("send failed")
                raise

    if os.path.exists(args.socket):
        os.remove(args.socket)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=256))
    pb2_grpc.add_DiscoveryHandlerServicer_to_server(Handler(), server)
    server.add_insecure_port(f"unix:{args.socket}")
    server.start()
    log(f"serving {args.name} on {args.socket}")

    def stop(*_):
        server.stop(0)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    options = []
    if args.authority:
        options.append(("grpc.default_authority", args.authority))
    request = pb2.RegisterDiscoveryHandlerRequest(
        name=args.name,
        endpoint=args.socket,
        endpoint_type=pb2.RegisterDiscoveryHandlerRequest.UDS,
        shared=args.shared,
    )

    def register():
        while True:
            counters.add("register_attempts")
            try:
                with grpc.insecure_channel(f"unix://{args.registration_socket}", options=options) as channel:
                    pb2_grpc.RegistrationStub(channel).RegisterDiscoveryHandler(request, timeout=10)
                counters.add("registrations")
                return
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    time.sleep(args.retry)
                    continue
                log(f"registration refused: {e.code()} {e.details()}")
                server.stop(0)
                os._exit(2)

    reregister.put("start")
    while True:
        reregister.get()
        register()


if __name__ == "__main__":
    main()
