#!/usr/bin/env python3
"""Optional end-to-end check against a real OpenAI-compatible server.

Starts budgetgate in front of UPSTREAM_BASE_URL (e.g. a local llama.cpp or vLLM
server at http://127.0.0.1:8081/v1), sends a few requests through it with the
official openai SDK, non-streaming and streaming, and prints estimated vs
settled tokens per request (read from the gateway's JSON log lines).

    .venv/bin/python scripts/sdk_check.py http://127.0.0.1:8081/v1 --model my-model [--max-tokens-only] [--api-key-env VAR]
"""
import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

import openai

ROOT = pathlib.Path(__file__).resolve().parent.parent
KEY = "sk-sdk-check"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("upstream", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8081/v1")
    ap.add_argument("--model", required=True, help="model name the upstream serves")
    ap.add_argument("--api-key-env", help="environment variable holding the upstream key")
    ap.add_argument("--max-tokens-only", action="store_true", help="upstream ignores max_completion_tokens")
    ap.add_argument("--kind", default="self_hosted", choices=["openai", "self_hosted"])
    args = ap.parse_args()

    binary = ROOT / "target" / "debug" / "budgetgate"
    if not binary.exists():
        subprocess.run(["cargo", "build", "--quiet"], cwd=ROOT, check=True)
    upstream = f'''
[[upstreams]]
name = "checked"
kind = "{args.kind}"
base_url = "{args.upstream}"
max_tokens_only = {"true" if args.max_tokens_only else "false"}
''' + (f'api_key_env = "{args.api_key_env}"\n' if args.api_key_env else "")
    cfg = f'''
[server]
listen = "127.0.0.1:0"
{upstream}
[[models]]
name = "{args.model}"
upstreams = ["checked"]
default_max_output_tokens = 64
max_output_tokens = 512
[[tenants]]
name = "check"
keys = [{{ id = "k", sha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}" }}]
limits = {{ tpm = 1000000 }}
'''
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(cfg)
    gw = subprocess.Popen([str(binary), "--log-json", "serve", "--config", f.name], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    line = gw.stdout.readline()
    if not line.startswith("budgetgate listening on "):
        print("gateway did not start:", gw.stderr.read(), file=sys.stderr)
        sys.exit(1)
    base = line.split(" on ", 1)[1].strip() + "/v1"
    logs = []
    threading.Thread(target=lambda: logs.extend(gw.stderr), daemon=True).start()
    client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0)
    prompts = ["Say hello in five words.", "Write a haiku about budgets.", "Count from one to ten."]
    try:
        for p in prompts:
            msgs = [{"role": "user", "content": p}]
            r = client.chat.completions.create(model=args.model, messages=msgs, max_tokens=48)
            print(f"non-streaming: {r.usage.total_tokens if r.usage else '?'} tokens reported upstream")
            text = "".join(c.choices[0].delta.content or "" for c in
                           client.chat.completions.create(model=args.model, messages=msgs, stream=True)
                           if c.choices)
            print(f"streaming: {len(text)} characters")
        time.sleep(0.5)
    finally:
        gw.terminate()
        gw.wait(5)
    print(f"{'reservation':38} {'estimated':>9} {'settled':>8}")
    for raw in logs:
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError:
            continue
        fields = rec.get("fields", {})
        if "settled" in fields:
            print(f"{fields.get('reservation_id', '?'):38} {fields.get('estimated', '?'):>9} {fields['settled']:>8}")


if __name__ == "__main__":
    main()
