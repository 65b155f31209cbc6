#!/usr/bin/env python3
"""A real Prometheus server scrapes `wsync demo` (ctest prometheus_scrape_test, label multiproc).

1. `promtool check rules` accepts integration/prometheus/wsync_alerts.yml, and the Grafana dashboard
   parses as JSON with a panel for every metric family.
2. `wsync demo --metrics --linger_s S` runs a small job (qwen2.5-tiny, 2 trainers, 2 rollouts); its
   exporter URLs are read from its output while it runs.
3. Prometheus (Debian's `prometheus`) starts on loopback with the shipped scrape configuration
   (prometheus.yml.template rendered with the demo's targets and a 1 s scrape interval), and its
   HTTP API is queried until it has scraped the final figures: the sum of
   wsync_bytes_received_total over the rollout processes equals the bytes the demo reports, and
   every rollout's wsync_version equals the last version. The demo's own URL serves the families.

Standard library only; every wait has a deadline. Exit status 0 on success.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from harness import free_ports  # noqa: E402

FAMILIES = [
    "wsync_syncs_total", "wsync_sync_duration_seconds", "wsync_last_sync_duration_seconds",
    "wsync_sync_predicted_seconds", "wsync_rounds", "wsync_rounds_total",
    "wsync_bytes_sent_total", "wsync_bytes_received_total", "wsync_direct_bytes_total",
    "wsync_staged_bytes_total", "wsync_local_copy_bytes_total", "wsync_arena_bytes",
    "wsync_arena_peak_bytes", "wsync_version", "wsync_state", "wsync_errors_total",
    "wsync_plan_info", "wsync_calibration_age_seconds", "wsync_delta_compared_elements_total",
    "wsync_delta_changed_elements_total", "wsync_delta_changed_fraction",
    "wsync_delta_saved_bytes_total", "wsync_delta_encode_seconds_total",
    "wsync_delta_apply_seconds_total",
]
STEPS = 3
LINGER_S = 20
JOB = "wsync-scrape-test"


def log(*args):
    print("prometheus_scrape_test:", *args, flush=True)


def fail(message):
    log("FAILED:", message)
    sys.exit(1)


def free_port():
    port, = free_ports(1)
    return port


# Loopback only: never through a proxy from the environment (http_proxy and the like).
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url, timeout=5):
    with OPENER.open(url, timeout=timeout) as response:
        return response.read().decode()


def query(prometheus_port, expression):
    """The instant vector of `expression`: a list of (labels, float value)."""
    url = "http://127.0.0.1:%d/api/v1/query?%s" % (
        prometheus_port, urllib.parse.urlencode({"query": expression}))
    answer = json.loads(http_get(url))
    if answer.get("status") != "success":
        raise RuntimeError("query %r: %s" % (expression, answer))
    return [(r["metric"], float(r["value"][1])) for r in answer["data"]["result"]]


def check_rules_and_dashboard(promtool, config_dir):
    rules = os.path.join(config_dir, "wsync_alerts.yml")
    result = subprocess.run([promtool, "check", "rules", rules], capture_output=True, text=True,
                            timeout=60)
    if result.returncode != 0:
        fail("promtool check rules %s:\n%s%s" % (rules, result.stdout, result.stderr))
    log(result.stdout.strip().replace("\n", "; "))
    for alert in ("WsyncSyncSlowerThanPredicted", "WsyncRolloutDirty", "WsyncRolloutVersionLag",
                  "WsyncErrors"):
        if alert not in open(rules).read():
            fail("alert %s is missing from %s" % (alert, rules))
    with open(os.path.join(config_dir, "wsync_dashboard.json")) as f:
        dashboard = json.load(f)
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    missing = [family for family in FAMILIES if family not in exprs]
    if missing:
        fail("the dashboard has no panel for %s" % ", ".join(missing))
    log("dashboard: %d panels, every family shown" % len(dashboard["panels"]))


def render_config(config_dir, work, trainers, rollouts):
    with open(os.path.join(config_dir, "prometheus.yml.template")) as f:
        text = f.read()
    values = {
        "SCRAPE_INTERVAL": "1s",
        "WSYNC_JOB": JOB,
        "TRAINER_TARGETS": json.dumps(trainers),
        "ROLLOUT_TARGETS": json.dumps(rollouts),
        "RULES_FILE": os.path.join(config_dir, "wsync_alerts.yml"),
    }
    for key, value in values.items():
        text = text.replace("${%s}" % key, value)
    left = re.findall(r"\$\{[A-Z_]+\}", text)
    if left:
        fail("placeholders left in the rendered scrape config: %s" % left)
    path = os.path.join(work, "prometheus.yml")
    with open(path, "w") as f:
        f.write(text)
    return path


class Demo:
    """`wsync demo` with its standard output collected line by line on a thread."""

    def __init__(self, wsync):
        command = [wsync, "demo", "--model=qwen2.5-tiny", "--from=megatron(tp=2)",
                   "--to=vllm(tp=2)", "--steps=%d" % STEPS, "--metrics",
                   "--linger_s=%d" % LINGER_S, "--demo_timeout_s=200"]
        log("running", " ".join(command))
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            with self.lock:
                self.lines.append(line.rstrip("\n"))

    def output(self):
        with self.lock:
            return list(self.lines)

    def wait_for(self, pattern, deadline):
        """The first match of `pattern` in the output, waiting until `deadline`."""
        regex = re.compile(pattern)
        while time.time() < deadline:
            for line in self.output():
                match = regex.search(line)
                if match:
                    return match
            if self.process.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.1)
        fail("the demo did not print /%s/; its output:\n%s" % (pattern,
                                                               "\n".join(self.output())))

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--wsync", required=True)
    parser.add_argument("--prometheus", default=shutil.which("prometheus"))
    parser.add_argument("--promtool", default=shutil.which("promtool"))
    parser.add_argument("--config_dir", required=True)
    args = parser.parse_args()
    if not args.prometheus or not args.promtool:
        fail("prometheus and promtool are required (Debian package prometheus; make deps)")

    check_rules_and_dashboard(args.promtool, args.config_dir)

    work = tempfile.mkdtemp(prefix="wsync-prometheus-")
    demo = Demo(args.wsync)
    server = None
    try:
        start = time.time()
        # The URLs are printed before the processes start.
        targets = {"trainer": {}, "rollout": {}}
        header_deadline = start + 60
        demo.wait_for(r"metrics: http://.* \(rollout 1\)", header_deadline)
        for line in demo.output():
            match = re.search(r"metrics: http://([0-9.]+:\d+)/metrics \((trainer|rollout) (\d+)\)",
                              line)
            if match:
                targets[match.group(2)][int(match.group(3))] = match.group(1)
        if len(targets["trainer"]) != 2 or len(targets["rollout"]) != 2:
            fail("expected 2 trainer and 2 rollout metrics URLs, got %s" % targets)
        log("targets:", targets)

        config = render_config(args.config_dir, work, sorted(targets["trainer"].values()),
                               sorted(targets["rollout"].values()))
        prometheus_port = free_port()
        server_log = open(os.path.join(work, "prometheus.log"), "w")
        server = subprocess.Popen(
            [args.prometheus, "--config.file=" + config,
             "--storage.tsdb.path=" + os.path.join(work, "data"),
             "--web.listen-address=127.0.0.1:%d" % prometheus_port, "--log.level=warn"],
            stdout=server_log, stderr=subprocess.STDOUT)

        # The demo's total: printed once every process reported the last step.
        match = demo.wait_for(r"metrics: after (\d+) steps the rollouts received (\d+) bytes",
                              time.time() + 150)
        steps, received = int(match.group(1)), int(match.group(2))
        if steps != STEPS or received <= 0:
            fail("the demo reported %d steps, %d bytes" % (steps, received))
        log("the demo reports %d bytes received by the rollouts over %d steps" %
            (received, steps))

        # The demo's own URL, while it lingers (what `curl` on it shows).
        text = http_get("http://%s/metrics" % targets["rollout"][0])
        # Every family but the calibration age, which has no series without a calibration.
        missing = [f for f in FAMILIES
                   if "# TYPE %s " % f not in text and f != "wsync_calibration_age_seconds"]
        if missing:
            fail("the rollout's /metrics lacks %s" % missing)

        # Prometheus, once it scraped the final figures (the processes linger LINGER_S seconds).
        deadline = time.time() + LINGER_S - 3
        last = None
        while time.time() < deadline:
            try:
                up = query(prometheus_port, 'up{job=~"wsync-trainer|wsync-rollout"} == 1')
                total = query(prometheus_port,
                              'sum(wsync_bytes_received_total{job="wsync-rollout",'
                              'wsync_job="%s"})' % JOB)
                versions = query(prometheus_port,
                                 'wsync_version{job="wsync-rollout",role="rollout"}')
                last = (len(up), total, versions)
                if (len(up) == 4 and total and int(total[0][1]) == received and
                        len(versions) == 2 and all(v == STEPS for _, v in versions)):
                    break
            except (OSError, ValueError, RuntimeError) as error:
                last = error  # Not up yet.
            time.sleep(0.5)
        else:
            fail("Prometheus did not show the demo's figures in time; last answer: %r "
                 "(want 4 targets up, %d bytes, version %d)" % (last, received, STEPS))
        log("Prometheus: %d targets up, sum(wsync_bytes_received_total) over rollouts = %d "
            "(the demo's %d), wsync_version of both rollouts = %d" %
            (last[0], int(last[1][0][1]), received, STEPS))
        trainers_version = query(prometheus_port, 'wsync_version{role="trainer"}')
        if len(trainers_version) != 2 or any(v != STEPS for _, v in trainers_version):
            fail("trainer versions: %s" % trainers_version)
        rules = json.loads(http_get("http://127.0.0.1:%d/api/v1/rules" % prometheus_port))
        groups = [g["name"] for g in rules["data"]["groups"]]
        if "wsync" not in groups:
            fail("Prometheus did not load the alert rules: %s" % groups)
        dirty = query(prometheus_port, 'wsync_state{state="dirty"} == 1')
        if dirty:
            fail("dirty processes after a clean run: %s" % dirty)

        code = demo.process.wait(timeout=LINGER_S + 60)
        if code != 0:
            fail("the demo exited with %d:\n%s" % (code, "\n".join(demo.output())))
        log("ok in %.1f s" % (time.time() - start))
    finally:
        demo.stop()
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
