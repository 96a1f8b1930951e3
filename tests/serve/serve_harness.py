"""What the gdn serve end-to-end tests share: the server's parameters (which their offline references
repeat), a `gdn serve` process on a free loopback port, and plain HTTP GET.

Environment: GDN_CLI (the gdn tool), GDN_TINY (models/gdn-tiny).
"""

import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request

import openai

CLI = os.environ["GDN_CLI"]
TINY = os.environ["GDN_TINY"]
THREADS = 2
MAX_CONTEXT = 4096
STEP = 256
NOTHINK = {"chat_template_kwargs": {"enable_thinking": False}}


def get(url, headers=None):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class Server:
    """`gdn serve MODEL` with the parameters above and `args`, ready (/health 200) when constructed."""

    def __init__(self, *args, model=TINY):
        self.proc = subprocess.Popen(
            [CLI, "serve", model, "--port", "0", "--threads", str(THREADS), "--max-context", str(MAX_CONTEXT),
             "--step-tokens", str(STEP), "--shutdown-timeout", "5", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        assert m, f"no port in {line!r}: {self.proc.stderr.read() if self.proc.poll() is not None else ''}"
        self.port = int(m.group(1))
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            status, _ = get(self.url + "/health")
            if status == 200:
                break
            assert status == 503  # loading
            time.sleep(0.05)
        else:
            raise AssertionError("the server never became ready")

    def client(self, key="unused"):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=60)

    def metrics(self):
        _, text = get(self.url + "/metrics")
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=30)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return rc
