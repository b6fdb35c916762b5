"""Streams one chat completion through the gateway with the official openai
SDK (`create(stream=True)`) and reports what the client saw.

argv[1]: JSON object of keyword arguments for `chat.completions.create`
(`stream=True` is added). Prints one JSON line: content and delta counts per
choice, finish reasons, usage chunks, rate-limit headers, and the exception
if the SDK raised one (the script itself still exits 0)."""
import json
import os
import sys

import openai

client = openai.OpenAI(base_url=os.environ["BASE_URL"], api_key=os.environ["API_KEY"], max_retries=0)
kwargs = json.loads(sys.argv[1])
out = {"content": {}, "deltas": {}, "finish": {}, "usage": None, "usage_chunks": 0,
       "chunks": 0, "error": None, "status": None, "headers": {}}
try:
    raw = client.chat.completions.with_raw_response.create(stream=True, **kwargs)
    out["status"] = raw.status_code
    out["headers"] = {k: v for k, v in raw.headers.items()
                      if k.startswith("x-") or k.lower().startswith("ratelimit")}
    for chunk in raw.parse():
        out["chunks"] += 1
        if chunk.usage is not None:
            out["usage_chunks"] += 1
            out["usage"] = chunk.usage.model_dump()
        for c in chunk.choices:
            i = str(c.index)
            if c.delta is not None and c.delta.content:
                out["content"][i] = out["content"].get(i, "") + c.delta.content
                out["deltas"][i] = out["deltas"].get(i, 0) + 1
            if c.finish_reason:
                out["finish"][i] = c.finish_reason
except openai.APIStatusError as e:
    out["error"] = {"type": type(e).__name__, "message": str(e), "status": e.status_code,
                    "headers": {k: v for k, v in e.response.headers.items()}}
except Exception as e:  # noqa: BLE001 - the test asserts on the type
    out["error"] = {"type": type(e).__name__, "message": str(e)}
print(json.dumps(out))
