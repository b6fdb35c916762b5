"""The official `anthropic` SDK (pinned) against the gateway's /v1/messages.

Usage: anthropic_sdk.py MODE [MODEL]; prints one JSON line.
Modes: count_tokens, basic (create, create stream=True, messages.stream + get_final_message,
tool-use round trip), cutoff_helper / cutoff_create (the two SDK styles on a
stream the gateway cuts off), rate_limited (one call with default retries; reports the error).
"""
import json
import os
import sys

import anthropic
import httpx2

mode = sys.argv[1]
model = sys.argv[2] if len(sys.argv) > 2 else "claude-test"
base = os.environ["BASE_URL"].removesuffix("/v1")
sent = []  # every HTTP request the SDK made (its retries included)
http = httpx2.Client(event_hooks={"request": [lambda r: sent.append(r.url.path)]})
client = anthropic.Anthropic(base_url=base, api_key=os.environ["API_KEY"], http_client=http)
msgs = [{"role": "user", "content": "Say hello."}]
out = {}

if mode == "basic":
    m = client.messages.create(model=model, max_tokens=64, messages=msgs)
    out["text"] = m.content[0].text
    out["stop_reason"] = m.stop_reason
    out["usage"] = m.usage.model_dump()
    raw = client.messages.with_raw_response.create(model=model, max_tokens=64, messages=msgs)
    out["headers"] = {k: v for k, v in raw.headers.items() if k.startswith("anthropic-") or k == "request-id"}
    text = ""
    for ev in client.messages.create(model=model, max_tokens=64, messages=msgs, stream=True):
        if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
            text += ev.delta.text
    out["stream_text"] = text
    with client.messages.stream(model=model, max_tokens=64, messages=msgs) as s:
        final = s.get_final_message()
    out["final_text"] = final.content[0].text
    out["final_usage"] = final.usage.model_dump()
    tools = [{"name": "get_weather", "description": "Weather by city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    first = client.messages.create(model=model, max_tokens=64, messages=msgs, tools=tools,
                                   extra_headers={"x-mock-messages": "tool_use=1"})
    call = [b for b in first.content if b.type == "tool_use"][0]
    second = client.messages.create(model=model, max_tokens=64, tools=tools, messages=msgs + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny"}]},
    ])
    out["tool"] = {"stop_reason": first.stop_reason, "input": call.input, "answer_stop": second.stop_reason}
elif mode == "count_tokens":
    out["input_tokens"] = client.messages.count_tokens(model=model, messages=msgs).input_tokens
elif mode == "cutoff_helper":
    with client.messages.stream(model=model, max_tokens=32000, messages=msgs) as s:
        final = s.get_final_message()
    out = {"stop_reason": final.stop_reason, "output_tokens": final.usage.output_tokens,
           "text_tokens": len(final.content[0].text.split())}
elif mode == "cutoff_create":
    stop, n = None, 0
    for ev in client.messages.create(model=model, max_tokens=32000, messages=msgs, stream=True):
        if ev.type == "message_delta":
            stop, n = ev.delta.stop_reason, ev.usage.output_tokens
    out = {"stop_reason": stop, "output_tokens": n}
elif mode == "rate_limited":
    try:
        client.messages.create(model=model, max_tokens=64, messages=msgs)
        out["error"] = None
    except anthropic.RateLimitError as e:
        out["error"] = "RateLimitError"
        out["type"] = e.body["error"]["type"] if isinstance(e.body, dict) else None
        out["retry_after"] = e.response.headers.get("retry-after")
        out["should_retry"] = e.response.headers.get("x-should-retry")
        out["tokens_limit"] = e.response.headers.get("anthropic-ratelimit-tokens-limit")
        out["tokens_reset"] = e.response.headers.get("anthropic-ratelimit-tokens-reset")
    out["requests_sent"] = len(sent)
print(json.dumps(out))
