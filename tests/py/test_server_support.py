"""Shared by the `spark serve` tests: start a server on a free loopback
port, talk to it, stop it and check it exited cleanly (no sanitizer report).

No tests here; the name only keeps the server test files together."""
import http.client
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import openai

from conftest_models import TINY, make_chat_model
from sparktest import ROOT, SANITIZER_MARKS, SPARK_BIN


def server_model(tmp_root):
    """spark-tiny when it is there (a real trained model), else a synthetic
    model carrying a real tokenizer."""
    if (TINY / "config.json").exists():
        return TINY
    return make_chat_model(tmp_root)


def is_asan_build():
    try:
        return b"__asan_init" in Path(SPARK_BIN).read_bytes()
    except OSError:
        return False


def artifacts_dir():
    build = Path(os.environ.get("SPARK_BUILD", ROOT / "build"))
    out = build / "artifacts"
    out.mkdir(parents=True, exist_ok=True)
    return out


class Server:
    """`spark serve` as a child process; stderr goes to a file (a pipe that
    nobody reads would stall the server once full)."""

    def __init__(self, model, *args, env=None, api_key=None, timeout=120):
        self.api_key = api_key
        self.log_file = tempfile.NamedTemporaryFile(prefix="spark-serve-", suffix=".log", delete=False)
        cmd = [SPARK_BIN, "serve", "-m", str(model), "--port", "0", *map(str, args)]
        if api_key:
            cmd += ["--api-key", api_key]
        full_env = dict(os.environ)
        full_env.pop("SPARK_API_KEY", None)
        full_env.update(env or {})
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log_file, env=full_env)
        deadline = time.time() + timeout
        self.port = None
        while time.time() < deadline:
            m = re.search(r"listening on http://[^ ]*:(\d+)", self.log())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"spark serve exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.05)
        if self.port is None:
            self.proc.kill()
            raise RuntimeError(f"spark serve did not start:\n{self.log()}")

    def log(self):
        return Path(self.log_file.name).read_text(errors="replace")

    def url(self, path=""):
        return f"http://127.0.0.1:{self.port}{path}"

    def client(self, **kw):
        kw.setdefault("api_key", self.api_key or "unused")
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 300)
        return openai.OpenAI(base_url=self.url("/v1"), **kw)

    def connect(self, timeout=300):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def send(self, method, path, body=None, headers=None, auth=True, timeout=300):
        """Start a request on a new connection; returns the connection (read
        the response with conn.getresponse(), or close it to hang up).
        body: bytes/str sent as is, or any other value sent as JSON."""
        h = dict(headers or {})
        if auth and self.api_key:
            h.setdefault("Authorization", f"Bearer {self.api_key}")
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
            h.setdefault("Content-Type", "application/json")
        conn = self.connect(timeout)
        conn.request(method, path, body=body, headers=h)
        return conn

    def http(self, method, path, body=None, headers=None, auth=True, timeout=300):
        """One request; returns (status, headers, body text)."""
        conn = self.send(method, path, body, headers, auth, timeout)
        try:
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode("utf-8", "replace")
        finally:
            conn.close()

    def health(self):
        status, _, text = self.http("GET", "/health")
        assert status == 200, text
        return json.loads(text)

    def metrics(self):
        """/metrics as {name-with-labels: value}."""
        out = {}
        for line in self.http("GET", "/metrics")[2].splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def wait_idle(self, timeout=60):
        """Until no session is busy and nothing waits; returns /health."""
        deadline = time.time() + timeout
        while True:
            h = self.health()
            if h["sessions_active"] == 0 and h["queue_depth"] == 0:
                return h
            assert time.time() < deadline, f"server still busy: {h}"
            time.sleep(0.05)

    def rss_kb(self):
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def stop(self, timeout=120):
        """SIGTERM, then check: exit 0, no sanitizer report, no crash."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"spark serve did not stop on SIGTERM:\n{self.log()[-4000:]}")
        log = self.log()
        os.unlink(self.log_file.name)
        for mark in SANITIZER_MARKS:
            assert mark not in log, f"sanitizer report from spark serve:\n{log[-6000:]}"
        assert self.proc.returncode == 0, f"spark serve exited with {self.proc.returncode}:\n{log[-4000:]}"
        return log

