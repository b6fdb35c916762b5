#!/usr/bin/env python3
"""The newest clients' checks, run by scripts/clients-latest.sh (which
installs them under CLIENTS_PREFIX: npm/node_modules and venv).

Each case starts the simulated upstream and the debug gateway on a shipped
config (config/local.toml for OpenAI clients, config/local-anthropic.toml
for Anthropic ones) with the tenant's limits changed as the case needs, and
puts a loopback tap in front of the gateway that keeps every request line
and the gateway's status and headers for it. Prints one table row per
client × case: pass, fail (with the request that failed and the client's
last line) or "-" where a case does not apply to the client.
"""
import concurrent.futures
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request

import tomli_w

ROOT = pathlib.Path(__file__).resolve().parent.parent
PREFIX = pathlib.Path(os.environ["CLIENTS_PREFIX"])
NPM = PREFIX / "npm" / "node_modules"
PY = PREFIX / "venv" / "bin" / "python"
GATEWAY = pathlib.Path(os.environ.get("BUDGETGATE_BIN", ROOT / "target" / "debug" / "budgetgate"))
MOCK = pathlib.Path(os.environ.get("MOCK_UPSTREAM_BIN", ROOT / "target" / "debug" / "examples" / "mock_upstream"))
RUN_LIMIT = 180
KEYS = {"local.toml": ("sk-local-demo", "demo"), "local-anthropic.toml": ("sk-local-claude", "coder")}
CASES = ["say-hi", "streamed", "rate", "too-large", "quota", "cutoff", "tool-agent", "uncapped"]


class Tap:
    """A loopback relay in front of the gateway: per request, its line and
    the status and headers of the answer."""

    def __init__(self, target):
        self.target = target
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.wires = []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            s = socket.create_connection(self.target)
            wire = [bytearray(), bytearray()]
            self.wires.append(wire)
            threading.Thread(target=self.pipe, args=(c, s, wire[0]), daemon=True).start()
            threading.Thread(target=self.pipe, args=(s, c, wire[1]), daemon=True).start()

    @staticmethod
    def pipe(a, b, keep):
        try:
            while data := a.recv(65536):
                keep.extend(data)
                b.sendall(data)
        except OSError:
            pass
        for x in (a, b):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def exchanges(self):
        out = []
        for up, down in list(self.wires):
            reqs = re.findall(rb"(?:GET|POST|PUT|DELETE) /[^\r\n]* HTTP/1\.1\r\n", bytes(up))
            answers = re.split(rb"(?=HTTP/1\.1 \d{3} )", bytes(down))
            answers = [a for a in answers if a.startswith(b"HTTP/1.1 ")]
            for i, r in enumerate(reqs):
                a = answers[i].decode("utf-8", "replace") if i < len(answers) else ""
                head, _, body = a.partition("\r\n\r\n")
                lines = head.split("\r\n")
                status = int(lines[0].split(" ")[1]) if a else 0
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
                out.append({"request": r.decode().strip(), "status": status, "headers": headers, "body": body})
        return out

    def turns(self):
        return [e for e in self.exchanges()
                if re.match(r"POST /v1/(messages|responses|chat/completions)(\?| )", e["request"])]


def started(proc, prefix):
    line = proc.stdout.readline()
    if not line.startswith(prefix):
        raise RuntimeError(f"did not start: {line!r} {proc.stderr.read() if proc.poll() is not None else ''}")
    return line.split(" on ", 1)[1].strip()


class Stack:
    """The simulated upstream answering `output_tokens`, the gateway on
    config/`config` changed by `change`, and the tap."""

    def __init__(self, config, output_tokens=12, change=None):
        self.dir = tempfile.mkdtemp(prefix="clients-latest-")
        self.mock = subprocess.Popen([MOCK, "--listen", "127.0.0.1:0", "--output-tokens", str(output_tokens)],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        root = started(self.mock, "mock_upstream listening on ")
        cfg = tomllib.loads((ROOT / "config" / config).read_text())
        cfg["server"]["listen"] = "127.0.0.1:0"
        for u in cfg["upstreams"]:
            u["base_url"] = root if u.get("kind") == "anthropic" else root + "/v1"
        self.key, tenant = KEYS[config]
        if change:
            change(cfg, next(t for t in cfg["tenants"] if t["name"] == tenant))
        path = pathlib.Path(self.dir) / config
        path.write_text(tomli_w.dumps(cfg))
        self.log = open(pathlib.Path(self.dir) / "gateway.log", "w")
        # Its own HOME: the memory store's snapshot stays in the case's directory.
        env = dict(os.environ, HOME=self.dir, XDG_STATE_HOME=self.dir)
        self.gw = subprocess.Popen([GATEWAY, "serve", "--config", str(path)], stdout=subprocess.PIPE,
                                   stderr=self.log, text=True, env=env, cwd=self.dir)
        host, port = started(self.gw, "budgetgate listening on ").removeprefix("http://").rsplit(":", 1)
        self.direct = f"http://{host}:{port}"
        self.tap = Tap((host, int(port)))
        self.url = self.tap.url

    def close(self):
        for p in (self.gw, self.mock):
            p.terminate()
            p.wait()
        self.tap.sock.close()
        self.log.close()


def limits(**kw):
    def change(cfg, tenant):
        tenant["limits"].update(kw)
    return change


# --- the clients: each runs one turn against a Stack and returns (exit code, text)


def run(argv, env, cwd, stdin=None):
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, env=env, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=RUN_LIMIT)
        code, out = p.returncode, (p.stdout + "\n" + p.stderr).strip()
    except subprocess.TimeoutExpired:
        code, out = None, f"(killed after {RUN_LIMIT} s)"
    return code, out, time.monotonic() - t0


def base_env(home):
    env = {"PATH": os.environ["PATH"], "HOME": home, "LANG": "C.UTF-8",
           "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
           "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
           "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1"}
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    closed = "http://127.0.0.1:%d" % s.getsockname()[1]
    s.close()
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        env[k] = closed
    return env


class Cli:
    streamed_only = True

    def __init__(self, name, config):
        self.name, self.config = name, config

    def home(self):
        h = tempfile.mkdtemp(prefix=f"clients-latest-{self.name}-")
        os.makedirs(h + "/work")
        return h


class Codex(Cli):
    def version(self):
        return json.loads((NPM / "@openai/codex/package.json").read_text())["version"]

    def prepare(self, st, home):
        ch = home + "/codex-home"
        os.makedirs(ch, exist_ok=True)
        pathlib.Path(ch, "config.toml").write_text(
            'model_provider = "budgetgate"\n\n[model_providers.budgetgate]\nname = "budgetgate"\n'
            f'base_url = "{st.url}/v1"\nenv_key = "BUDGETGATE_API_KEY"\nwire_api = "responses"\n')
        env = base_env(home) | {"CODEX_HOME": ch, "BUDGETGATE_API_KEY": st.key}
        return env

    def turn(self, st, home, env, case):
        return run([NPM / ".bin/codex", "exec", "--skip-git-repo-check", "say hi"], env, home + "/work")

    def cutoff(self, cfg, tenant):
        m = next(m for m in cfg["models"] if m["name"] == "gpt-6*")
        m["reasoning"] = False
        m["default_max_output_tokens"] = 256
        tenant["limits"]["output_tpm"] = 600


class Claude(Cli):
    def version(self):
        return json.loads((NPM / "@anthropic-ai/claude-code/package.json").read_text())["version"]

    def prepare(self, st, home):
        os.makedirs(home + "/claude-config", exist_ok=True)
        return base_env(home) | {"CLAUDE_CONFIG_DIR": home + "/claude-config", "ANTHROPIC_BASE_URL": st.url,
                                 "ANTHROPIC_API_KEY": st.key}

    def turn(self, st, home, env, case):
        if case == "cutoff":
            # Thinking streams are never extended, so never cut off.
            env = env | {"CLAUDE_CODE_DISABLE_THINKING": "1"}
        return run([NPM / ".bin/claude", "-p", "say hi"], env, home + "/work")

    def cutoff(self, cfg, tenant):
        # 1,000 tokens a second, as tests/it/agents_cli.rs: 10,000 a second
        # outran the simulated stream on a loaded machine (20,000 tokens
        # relayed whole, never cut off); each resume then waits ~4 s.
        tenant["limits"].update(output_tpm=60_000, output_tpm_burst=6_000)


class OpenCode(Cli):
    """OpenCode with one custom provider: `openai` (OpenAI-compatible,
    Chat Completions) or `anthropic` (Messages)."""

    MODEL = {"local.toml": "gpt-4o-mini", "local-anthropic.toml": "claude-sonnet-4-5"}

    def version(self):
        return json.loads((NPM / "opencode-ai/package.json").read_text())["version"]

    def prepare(self, st, home):
        model = self.MODEL[self.config]
        # docs/AGENTS.md's block: without `limit.output` OpenCode asks for
        # 32,000, above gpt-4o-mini's 16,384 (a 400).
        output = 64000 if self.config == "local-anthropic.toml" else 16384
        npm = "@ai-sdk/anthropic" if self.config == "local-anthropic.toml" else "@ai-sdk/openai-compatible"
        conf = {"$schema": "https://opencode.ai/config.json", "autoupdate": False, "share": "disabled",
                "model": f"budgetgate/{model}",
                "provider": {"budgetgate": {"npm": npm, "name": "budgetgate",
                                            "options": {"baseURL": st.url + "/v1", "apiKey": st.key},
                                            "models": {model: {"name": model, "limit": {
                                                "context": 200000, "output": output}}}}}}
        path = pathlib.Path(home, "opencode.json")
        path.write_text(json.dumps(conf))
        return base_env(home) | {"OPENCODE_CONFIG": str(path), "XDG_CONFIG_HOME": home + "/.config",
                                 "XDG_DATA_HOME": home + "/.local/share", "XDG_CACHE_HOME": home + "/.cache"}

    def turn(self, st, home, env, case):
        return run([NPM / ".bin/opencode", "run", "say hi"], env, home + "/work")

    def cutoff(self, cfg, tenant):
        # A first reservation (the entry's default output) fits, the
        # extensions outrun a 1,000-a-second refill. An OpenAI model
        # reserves a client's cap whole by default (refused up front, never
        # cut off): extended instead here.
        tenant["limits"].update(output_tpm=60_000, output_tpm_burst=6_000)
        for m in cfg["models"]:
            if m["name"] == "gpt-4o-mini":
                m["client_cap_reservation"] = "incremental"


SDK_SCRIPT = ROOT / "scripts" / "clients_latest_sdk.py"
NODE_SCRIPT = ROOT / "scripts" / "clients_latest_sdk.mjs"


class Sdk:
    """An SDK driven by scripts/clients_latest_sdk.{py,mjs} `<client> <case>`:
    exit 0 when the client saw what the case expects."""
    streamed_only = False

    def __init__(self, name, config, node=False, package=None):
        self.name, self.config, self.node, self.package = name, config, node, package or name

    def version(self):
        if self.node:
            return json.loads((NPM / self.package / "package.json").read_text())["version"]
        return subprocess.run([PY, "-c", f"import importlib.metadata as m; print(m.version('{self.package}'))"],
                              capture_output=True, text=True).stdout.strip()

    def home(self):
        return tempfile.mkdtemp(prefix="clients-latest-sdk-")

    def prepare(self, st, home):
        return {"PATH": os.environ["PATH"], "HOME": home, "BASE_URL": st.url, "API_KEY": st.key}

    def turn(self, st, home, env, case):
        # ES modules resolve imports next to the script: run a copy in the prefix.
        script = NPM.parent / NODE_SCRIPT.name
        if self.node:
            script.write_text(NODE_SCRIPT.read_text())
        argv = (["node", script] if self.node else [PY, SDK_SCRIPT]) + [self.name, case]
        return run(argv, env, str(NPM.parent) if self.node else home)

    def cutoff(self, cfg, tenant):
        tenant["limits"].update(output_tpm=60_000, output_tpm_burst=6_000)


# --- the cases: each returns None (pass), "-" (not applicable) or why it failed


def failed(turns, code, out, why):
    bad = [t for t in turns if t["status"] >= 300] or turns[-1:]
    req = f"{bad[-1]['request']} -> {bad[-1]['status']}" if bad else "no request"
    last = out.strip().splitlines()[-1] if out.strip() else ""
    return f"{why}; {req}; exit {code}: {last[:160]}"


def one(client, config_change=None, output_tokens=12, turns_before=0, case="say-hi"):
    st = Stack(client.config, output_tokens, config_change)
    try:
        home = client.home()
        env = client.prepare(st, home)
        for _ in range(turns_before):
            code, out, _ = client.turn(st, home, env, "say-hi")
            if code != 0:
                return st.tap.turns(), code, out, None, "the first turn failed"
        code, out, took = client.turn(st, home, env, case)
        return st.tap.turns(), code, out, took, None
    finally:
        st.close()


def case_say_hi(client):
    turns, code, out, _, err = one(client)
    if code != 0 or not turns or any(t["status"] != 200 for t in turns):
        return failed(turns, code, out, "not answered")
    return None


def case_streamed(client):
    turns, code, out, _, _ = one(client, case="streamed")
    if code != 0 or not turns or "text/event-stream" not in turns[-1]["headers"].get("content-type", ""):
        return failed(turns, code, out, "no streamed answer")
    return None


def spend_rpm(st, config, until):
    """Keeps the tenant's `rpm` bucket empty, sending small requests
    straight to the gateway (past the tap), until `until()`: the client's
    first turn then meets it empty, however long the client takes to start."""
    anthropic = config == "local-anthropic.toml"
    path, body, headers = (
        ("/v1/messages", {"model": "claude-sonnet-4-5", "max_tokens": 4, "messages": [HI]},
         {"x-api-key": st.key, "anthropic-version": "2023-06-01"}) if anthropic else
        ("/v1/chat/completions", {"model": "gpt-4o-mini", "max_tokens": 4, "messages": [HI]},
         {"authorization": "Bearer " + st.key}))
    data = json.dumps(body).encode()
    while not until():
        req = urllib.request.Request(st.direct + path, data=data,
                                     headers=headers | {"content-type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=10).read()
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)


HI = {"role": "user", "content": "hi"}


def case_rate(client):
    # One request per 5 s, no burst, kept empty until the client's first
    # turn: it is refused with retry-after, then admitted.
    st = Stack(client.config, 12, limits(rpm=12, rpm_burst=1))
    try:
        home = client.home()
        env = client.prepare(st, home)
        spender = threading.Thread(target=spend_rpm, args=(st, client.config, lambda: st.tap.turns()), daemon=True)
        spender.start()
        code, out, _ = client.turn(st, home, env, "say-hi")
        turns = st.tap.turns()
    finally:
        st.close()
    refused = [i for i, t in enumerate(turns) if t["status"] == 429]
    if not refused:
        return failed(turns, code, out, "no rate refusal met")
    r = turns[refused[0]]
    if "retry-after" not in r["headers"] or r["headers"].get("x-should-retry") == "false":
        return failed(turns, code, out, "refusal not retryable")
    if code != 0 or not any(t["status"] == 200 for t in turns[refused[0]:]):
        return failed(turns, code, out, "not retried to an answer")
    return None


REQUESTED = re.compile(r"requested (\d+) tokens")


def case_too_large(client):
    turns, code, out, took, _ = one(client, limits(tpm=1))
    m = REQUESTED.search(turns[0]["body"]) if turns else None
    client.requested = int(m.group(1)) if m else None
    if len(turns) != 1 or turns[0]["status"] != 429 or turns[0]["headers"].get("x-should-retry") != "false":
        return failed(turns, code, out, f"not one refused attempt ({len(turns)} turns)")
    if code == 0:
        return failed(turns, code, out, "exit 0 on a refusal")
    return None


def case_quota(client):
    # A day's quota holding one turn's reservation (measured by too-large).
    requested = getattr(client, "requested", None)
    if not requested:
        return "no reservation measured (too-large failed)"
    # Less than a turn settles at: the first turn fits, the second does not.
    # At most 1,000 (as tests/it/agents_cli.rs): Claude Code 2.1.332's turn
    # reserves ~145k here (its whole cap: the quota's exposure cannot hold
    # it) and settles at ~4k, so a tenth of its reservation would hold a
    # second turn.
    margin = max(min(requested // 10, 1_000), 1)
    turns, code, out, took, err = one(client, limits(tokens_per_day=requested + margin), turns_before=1, case="quota")
    if err:
        return failed(turns, code, out, err)
    after = turns[1:]
    if len(after) != 1 or after[0]["status"] != 429 or after[0]["headers"].get("x-should-retry") != "false":
        return failed(turns, code, out, f"not one refused attempt ({len(after)} after the first)")
    if code == 0 or took > 15:
        return failed(turns, code, out, f"did not stop at once (exit {code} after {took:.1f} s)")
    return None


def case_cutoff(client):
    turns, code, out, took, _ = one(client, client.cutoff, output_tokens=20_000, case="cutoff")
    cut = [t for t in turns if t["status"] == 200 and re.search(
        r'"stop_reason":"max_tokens"|response\.incomplete|"finish_reason":"length"', t["body"])]
    if not cut:
        return failed(turns, code, out, "no stream was cut off")
    for t in cut:
        if not re.search(r"event: message_stop|response\.incomplete|data: \[DONE\]", t["body"]):
            return failed([t], code, out, "a cut stream without its terminal event")
    if code is None:
        return failed(turns, code, out, "hung")
    return None


def case_sdk_only(name):
    def case(client):
        if client.streamed_only:
            return "-"
        turns, code, out, _, _ = one(client, output_tokens=2000 if name == "uncapped" else 12, case=name)
        if code == 2:
            return "-"
        if code != 0:
            return failed(turns, code, out, "the client's check failed")
        return None
    return case


CASE_FNS = {"say-hi": case_say_hi, "streamed": case_streamed, "rate": case_rate, "too-large": case_too_large,
            "quota": case_quota, "cutoff": case_cutoff, "tool-agent": case_sdk_only("tool-agent"),
            "uncapped": case_sdk_only("uncapped")}


def main():
    # Stopped, still stop the gateway and the mock (the `finally`s).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    clients = [
        Codex("codex", "local.toml"), Claude("claude-code", "local-anthropic.toml"),
        OpenCode("opencode (openai-compatible)", "local.toml"),
        OpenCode("opencode (anthropic)", "local-anthropic.toml"),
        Sdk("openai", "local.toml", node=True), Sdk("@anthropic-ai/sdk", "local-anthropic.toml", node=True),
        Sdk("openai-py", "local.toml", package="openai"), Sdk("anthropic-py", "local-anthropic.toml",
                                                                package="anthropic"),
        Sdk("openai-agents", "local.toml"), Sdk("langchain-openai", "local.toml"),
    ]
    only = [o for o in os.environ.get("ONLY", "").split(",") if o]
    clients = [c for c in clients if not only or any(o in c.name for o in only)]

    def row(c):
        results, notes = [], []
        for case in CASES:
            try:
                r = CASE_FNS[case](c)
            except Exception as e:  # a broken check is a failed case, not a crash of the table
                r = f"check error: {e!r}"
            if r is None:
                results.append("pass")
            elif r == "-":
                results.append("-")
            else:
                results.append("FAIL")
                notes.append(f"  {c.name} {case}: {r}")
        return f"| {c.name} | {c.version()} | " + " | ".join(results) + " |", notes

    # Clients side by side (each case has its own gateway and mock): the
    # slowest, OpenCode's retried refusals, set the run's length.
    with concurrent.futures.ThreadPoolExecutor(int(os.environ.get("JOBS", "4"))) as pool:
        rows = list(pool.map(row, clients))
    print("| client | version | " + " | ".join(CASES) + " |")
    print("|---|---|" + "---|" * len(CASES))
    for line, _ in rows:
        print(line)
    notes = [n for _, ns in rows for n in ns]
    if notes:
        print("\nfailed:")
        print("\n".join(notes))
    sys.exit(1 if notes else 0)


if __name__ == "__main__":
    main()
