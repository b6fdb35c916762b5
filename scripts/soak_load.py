"""Mixed loopback load for scripts/soak.sh (not run in CI).

Workers loop until DURATION seconds have passed, each request chosen at
random: streamed chat (half asking for usage), whole chat, embeddings,
streams the client abandons after a few chunks (client disconnect), and
requests of the tenant `small` whose tight limits refuse most of them
(429). Prints one JSON line of counts every INTERVAL seconds and at the end.

env: BASE_URL (…/v1), KEY, SMALL_KEY, DURATION, WORKERS, INTERVAL."""
import asyncio
import json
import os
import random
import sys
import time

try:
    import httpx
except ImportError:  # the openai SDK of the test venv ships it as httpx2
    import httpx2 as httpx

BASE = os.environ["BASE_URL"]
KEY = os.environ["KEY"]
SMALL = os.environ["SMALL_KEY"]
DURATION = float(os.environ.get("DURATION", "60"))
WORKERS = int(os.environ.get("WORKERS", "16"))
INTERVAL = float(os.environ.get("INTERVAL", "30"))

counts = {}


def count(kind, outcome):
    k = f"{kind}:{outcome}"
    counts[k] = counts.get(k, 0) + 1


def chat_body(stream, usage=False, max_tokens=None):
    b = {"model": "gpt-4o-mini",
         "messages": [{"role": "user", "content": "soak " + "word " * random.randint(1, 200)}]}
    if stream:
        b["stream"] = True
        if usage:
            b["stream_options"] = {"include_usage": True}
    if max_tokens:
        b["max_tokens"] = max_tokens
    return b


async def streamed(client, key, kind, abandon_after=None, usage=False):
    body = chat_body(True, usage, random.choice([None, 16, 64]))
    async with client.stream("POST", f"{BASE}/chat/completions", json=body,
                             headers={"authorization": f"Bearer {key}"}) as r:
        if r.status_code != 200:
            await r.aread()
            count(kind, r.status_code)
            return
        chunks = 0
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                chunks += 1
                if abandon_after is not None and chunks >= abandon_after:
                    count(kind, "abandoned")
                    return  # closing the response drops the connection
                if line == "data: [DONE]":
                    count(kind, "done")
                    return
        count(kind, "eof")


async def whole(client, key, kind, path, body):
    r = await client.post(f"{BASE}/{path}", json=body, headers={"authorization": f"Bearer {key}"})
    count(kind, r.status_code)


async def one(client):
    p = random.random()
    if p < 0.35:
        await streamed(client, KEY, "stream", usage=random.random() < 0.5)
    elif p < 0.6:
        await whole(client, KEY, "chat", "chat/completions", chat_body(False, max_tokens=32))
    elif p < 0.7:
        await whole(client, KEY, "embed", "embeddings",
                    {"model": "text-embedding-3-small", "input": ["soak"] * random.randint(1, 8)})
    elif p < 0.85:
        await streamed(client, KEY, "disconnect", abandon_after=random.randint(1, 6))
    elif p < 0.95:
        await whole(client, SMALL, "small", "chat/completions", chat_body(False, max_tokens=64))
    else:
        await streamed(client, SMALL, "small_stream")


async def worker(client, until):
    while time.monotonic() < until:
        try:
            await one(client)
        except (httpx.HTTPError, OSError) as e:
            count("error", type(e).__name__)


async def report(until, started):
    while time.monotonic() < until:
        await asyncio.sleep(min(INTERVAL, max(0.0, until - time.monotonic())))
        print(json.dumps({"t": round(time.monotonic() - started), "counts": counts}), flush=True)


async def main():
    started = time.monotonic()
    until = started + DURATION
    limits = httpx.Limits(max_connections=WORKERS * 2, max_keepalive_connections=WORKERS)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await asyncio.gather(report(until, started), *(worker(client, until) for _ in range(WORKERS)))
    total = sum(counts.values())
    print(json.dumps({"t": round(time.monotonic() - started), "total": total, "counts": counts}), flush=True)
    return 0 if counts else 1


sys.exit(asyncio.run(main()))
