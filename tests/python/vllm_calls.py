"""vLLM's side of a weight update, as the tests drive wsync's engines (vLLM cannot be installed
here; written for the tests, not copied). Each piece reproduces vLLM's call sequence:

- `Worker`: the weight-transfer RPCs of vllm/v1/worker/gpu_worker.py as the releases read have
  them (stored file id 54489122067; the same calls in every generation of the stand-in):
  the engine is built at model load with `WeightTransferEngineFactory.create_engine(
  weight_transfer_config, vllm_config, device, model)`; `init_weight_transfer_engine(init_info)`
  = parse_init_info + init_transfer_engine ("Weight transfer not configured" without a config);
  `start_weight_update()` refuses a second active update, then engine.start_weight_update() and
  sets the update flag; `update_weights(update_info)` needs an active update and, when the
  engine raises, clears the flag and re-raises, nothing more (the session, the target and the
  engine's state stay as they were); `finish_weight_update()` needs one, calls
  engine.finish_weight_update(), then resets the target and clears the flag (a failed finish
  leaves it set); `shutdown()` calls engine.shutdown(). No worker read calls
  `abort_weight_update` (absent from the 0.33 base class, a no-op default on main's). The RPCs
  run one at a time, as vLLM's engine core runs `collective_rpc` on each worker's one thread:
  an RPC issued while another runs waits for it (so no abort can reach the engine through vLLM
  while update_weights runs).
- `serve(worker, port)`: the dev-mode RLHF HTTP routes (vllm/entrypoints/serve/dev/rlhf/
  api_router.py; GET /health from the API server): POST /init_weight_transfer_engine
  {"init_info": {...}}, /start_weight_update, /update_weights {"update_info": {...}},
  /finish_weight_update (with `weight_version` when the client gives one: `finish_route`, the
  served weights' version, "default" until set); a route's failure is an HTTP error. (vLLM's server reaches its workers with a collective RPC; here each worker process
  serves its own routes and the client fans out.) /shutdown is the tests' own.
- `FanOutHTTPClient(urls)`: a VLLMWeightSyncClient (the four-method protocol of base.py) posting
  as vllm/distributed/weight_transfer/clients.py's HTTPVLLMWeightSyncClient does (@ 81ea9e9d;
  `finish_weight_update(weight_version=None)` as its later versions take it, posting the key only
  when given), to every worker at once and waiting for all, as its RayVLLMWeightSyncClient fans out over
  actor handles.
"""

import concurrent.futures
import http.server
import json
import logging
import threading
import urllib.error
import urllib.request

logger = logging.getLogger("vllm_calls")


def WeightTransferConfig(**fields):  # noqa: N802 - builds vLLM's config class (the stand-in).
    """vllm.config.weight_transfer.WeightTransferConfig(**fields) of the stand-in imported now
    (unknown fields refused as upstream's pydantic config refuses them)."""
    from vllm.config.weight_transfer import WeightTransferConfig as config
    return config(**fields)


class Worker:
    def __init__(self, weight_transfer_config, vllm_config, device, model):
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
        self.vllm_config = vllm_config
        self.weight_transfer_engine = None
        self._weight_update_active = False
        self._rpc = threading.Lock()  # collective_rpc: one RPC at a time on the worker.
        # The engine core's weight version (what vLLM reports as the served weights' version)
        # and every version a finish set, in order (the tests' record): see finish_route.
        self.served_weight_version = "default"
        self.served_versions = []
        if weight_transfer_config is not None:
            self.weight_transfer_engine = WeightTransferEngineFactory.create_engine(
                weight_transfer_config, vllm_config, device, model)

    def _check_weight_transfer_engine(self):
        if self.weight_transfer_engine is None:
            raise RuntimeError("Weight transfer not configured. Please set "
                               "weight_transfer_config to enable weight transfer.")

    def init_weight_transfer_engine(self, init_info):
        with self._rpc:
            self._check_weight_transfer_engine()
            engine = self.weight_transfer_engine
            engine.init_transfer_engine(engine.parse_init_info(init_info))

    def start_weight_update(self):
        with self._rpc:
            self._check_weight_transfer_engine()
            if self._weight_update_active:
                raise RuntimeError("start_weight_update called while a weight update is "
                                   "already active. Call finish_weight_update first.")
            self.weight_transfer_engine.start_weight_update()
            self._weight_update_active = True

    def update_weights(self, update_info):
        with self._rpc:
            self._check_weight_transfer_engine()
            if not self._weight_update_active:
                raise RuntimeError("start_weight_update must be called before update_weights.")
            try:
                self.weight_transfer_engine.update_weights(update_info)
            except BaseException:
                self._weight_update_active = False  # Only the flag: no abort, no reset.
                raise

    def finish_weight_update(self):
        with self._rpc:
            self._check_weight_transfer_engine()
            if not self._weight_update_active:
                raise RuntimeError("finish_weight_update called without a matching "
                                   "start_weight_update.")
            self.weight_transfer_engine.finish_weight_update()
            self.weight_transfer_engine.reset_weight_update_target()
            self._weight_update_active = False

    def shutdown(self):
        with self._rpc:
            if self.weight_transfer_engine is not None:
                self.weight_transfer_engine.shutdown()


_ROUTES = {
    "/init_weight_transfer_engine": lambda w, body: w.init_weight_transfer_engine(
        body.get("init_info", {})),
    "/start_weight_update": lambda w, body: w.start_weight_update(),
    "/update_weights": lambda w, body: w.update_weights(body.get("update_info", {})),
    "/finish_weight_update": lambda w, body: finish_route(w, body.get("weight_version")),
}


def finish_route(worker, weight_version):
    """The engine side of POST /finish_weight_update {"weight_version": ...}: LLM / AsyncLLM's
    finish_weight_update(weight_version=None) (docs.vllm.ai, vllm.entrypoints.llm.LLM: "Finish
    the weight update and set its version if provided"): the workers' finish_weight_update (a
    collective RPC, no argument), then the served weights' version is set only when given and
    only after the workers finished; it stays "default" until a finish names one."""
    worker.finish_weight_update()
    if weight_version is not None:
        worker.served_weight_version = str(weight_version)
        worker.served_versions.append(worker.served_weight_version)


def serve(worker, port):
    """Serves the routes on 127.0.0.1:port in a background thread; returns (server, stopped):
    POST /shutdown sets `stopped`. Requests run concurrently (vLLM's API server is async)."""
    stopped = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802 - vLLM's GET /health: 200 once the server is up.
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):  # noqa: N802 - http.server's name.
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else {}
                if self.path == "/shutdown":
                    stopped.set()
                else:
                    route = _ROUTES.get(self.path)
                    if route is None:
                        raise KeyError(f"no route {self.path}")
                    route(worker, body)
                code, reply = 200, {"status": "ok"}
            except Exception as error:  # noqa: BLE001 - an HTTP error, as vLLM's routes.
                code, reply = 500, {"error": f"{type(error).__name__}: {error}"}
            data = json.dumps(reply).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, stopped


def trainer_client(rank, urls):
    """A trainer rank's VLLMWeightSyncClient: rank 0 posts to every worker (once each answers
    GET /health, as an RL script waits for vLLM), the other ranks post nothing."""
    if rank != 0:
        return NoCallsClient()
    client = FanOutHTTPClient(urls)
    client.wait_ready()
    return client


def send_rounds(engine, versions, load, step_barrier=None):
    """[(version, None or the error as text)] of engine.send_weights() per version, each after
    load(version) put that version's weights in the trainer's module. `step_barrier` (e.g. a
    torch.distributed barrier of the trainer ranks) runs after each send, as the next training
    step's collectives hold every rank until all have sent: no rank starts the next sync while
    rank 0 still waits for the workers' answers (a worker replacing an aborted session answers
    once it rejoined)."""
    rounds = []
    for version in versions:
        load(version)
        try:
            engine.send_weights()
            rounds.append((version, None))
        except Exception as error:  # noqa: BLE001
            rounds.append((version, f"{type(error).__name__}: {error}"))
        if step_barrier is not None:
            step_barrier()
    return rounds


def finish_refusal(engine):
    """What the engine's finish_weight_update raises, as text (None when it does not): after a
    failed update it must refuse ("do not serve")."""
    try:
        engine.finish_weight_update()
    except Exception as refusal:  # noqa: BLE001
        return str(refusal)
    return None


def serve_until_shutdown(worker, port, seconds):
    """Serves `worker` (see serve) until POST /shutdown or `seconds`, then shuts it down."""
    server, stopped = serve(worker, port)
    try:
        stopped.wait(seconds)
    finally:
        server.shutdown()
        worker.shutdown()


def job_process(index, ports, tp, secret, standin, trainer, rollout):
    """Process `index` of a job of `tp` trainer ranks, then `tp` workers: `import vllm` finds the
    stand-in, "wsync" is registered as vLLM's load_general_plugins does with the entry point,
    and the process runs trainer(rank, coordinator, worker urls) or rollout(rank, http port).
    `ports`: the coordinator's, then one HTTP port per worker."""
    import os
    import sys
    sys.path.insert(0, standin)
    wsync_port, http_ports = ports[0], ports[1:]
    # The engine's launch configuration (what `vllm serve` would be started with): its secret
    # and coordinator; the trainer's own secret comes from the same variable.
    os.environ["WSYNC_SECRET"] = secret
    os.environ["WSYNC_COORDINATOR_HOST"] = "127.0.0.1"
    os.environ["WSYNC_COORDINATOR_PORT"] = str(wsync_port)
    import wsync.vllm
    wsync.vllm.register()
    if index < tp:
        return trainer(index, f"127.0.0.1:{wsync_port}",
                       [f"http://127.0.0.1:{p}" for p in http_ports])
    return rollout(index - tp, http_ports[index - tp])


class FanOutHTTPClient:
    def __init__(self, base_urls, timeout=60.0):
        self.base_urls = [u.rstrip("/") for u in base_urls]
        self.timeout = timeout
        self.calls = []  # The routes posted, in order (the tests check the sequence).

    def wait_ready(self, timeout=60.0):
        """Polls every server's GET /health until it answers (an RL script waits so for vLLM)."""
        import time
        deadline = time.time() + timeout
        for url in self.base_urls:
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                        if response.status == 200:
                            break
                except OSError:
                    if time.time() > deadline:
                        raise
                time.sleep(0.05)

    def _post_one(self, url, path, payload):
        data = json.dumps(payload if payload is not None else {}).encode()
        request = urllib.request.Request(f"{url}/{path}", data=data, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                response.read()
        except urllib.error.HTTPError as error:  # raise_for_status, with the route's reason.
            detail = error.read().decode(errors="replace")
            raise RuntimeError(f"POST {url}/{path}: HTTP {error.code}: {detail}") from None

    def _post(self, path, payload=None):
        self.calls.append(path)
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(self.base_urls)) as pool:
            futures = [pool.submit(self._post_one, url, path, payload) for url in self.base_urls]
            errors = []
            for future in futures:
                try:
                    future.result()
                except Exception as error:  # noqa: BLE001
                    errors.append(error)
        if errors:
            raise errors[0]

    def init_weight_transfer_engine(self, init_info):
        self._post("init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self):
        self._post("start_weight_update")

    def update_weights(self, update_info):
        self._post("update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version=None):
        # The key only when a version is given, as the clients whose finish takes one post it.
        self._post("finish_weight_update",
                   None if weight_version is None else {"weight_version": weight_version})

    def shutdown_servers(self):
        self._post("shutdown")


class NoCallsClient:
    """The client a non-sender trainer rank holds: vLLM's engines never call it there."""

    def _refuse(self, name):
        raise AssertionError(f"a non-sender trainer rank called the client's {name}")

    def init_weight_transfer_engine(self, init_info):
        self._refuse("init_weight_transfer_engine")

    def start_weight_update(self):
        self._refuse("start_weight_update")

    def update_weights(self, update_info):
        self._refuse("update_weights")

    def finish_weight_update(self, weight_version=None):
        self._refuse("finish_weight_update")
