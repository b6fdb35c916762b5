"""The Responses API through the gateway with the official openai SDK.

argv[1] is the mode:

- `basic`: `responses.create` (whole and `stream=True`), `responses.stream(...)`,
  a function-tool round trip with `function_call_output`, and a
  `previous_response_id` follow-up. Prints, per request in order, its usage
  and the `x-ratelimit-remaining-tokens` it was answered with.
- `cutoff create` / `cutoff helper`: a stream the gateway cuts off, read with
  `create(stream=True)` or with `responses.stream(...)`; prints the last event of each, whether
  iteration raised, and what `get_final_response()` did.
- `error`: a stream that ends in an error event; prints the exception type.

Prints one JSON line; the script exits 0 unless something unexpected happened."""
import json
import os
import sys

import openai

client = openai.OpenAI(base_url=os.environ["BASE_URL"], api_key=os.environ["API_KEY"], max_retries=0)
MODEL = "gpt-4o-mini"
mode = sys.argv[1]
out = {"requests": []}


def remaining(headers):
    v = headers.get("x-ratelimit-remaining-tokens")
    return int(v) if v is not None else None


def record(kind, usage, headers, **extra):
    out["requests"].append({"kind": kind, "usage": usage.model_dump() if usage else None,
                            "remaining": remaining(headers), **extra})


if mode == "basic":
    raw = client.responses.with_raw_response.create(model=MODEL, instructions="Be brief.", input="Say hello.")
    first = raw.parse()
    record("create", first.usage, raw.headers, status=first.status, text=first.output_text)

    raw = client.responses.with_raw_response.create(model=MODEL, input="Say hello again.", stream=True)
    types, text, final = [], "", None
    for ev in raw.parse():
        types.append(ev.type)
        if ev.type == "response.output_text.delta":
            text += ev.delta
        if ev.type == "response.completed":
            final = ev.response
    record("create_stream", final.usage, raw.headers, last=types[-1], text=text,
           final_text=final.output_text)

    with client.responses.stream(model=MODEL, input="Stream with the helper.") as s:
        types = [ev.type for ev in s]
        helper_final = s.get_final_response()
        record("stream_helper", helper_final.usage, s._response.headers, last=types[-1],
               text=helper_final.output_text)

    tools = [{"type": "function", "name": "lookup", "description": "Look a word up.",
              "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}]
    raw = client.responses.with_raw_response.create(model=MODEL, input="Look up 'the'.", tools=tools,
                                                    tool_choice="required")
    call_resp = raw.parse()
    call = call_resp.output[0]
    record("tool_call", call_resp.usage, raw.headers, item=call.type, name=call.name,
           arguments=json.loads(call.arguments))
    raw = client.responses.with_raw_response.create(
        model=MODEL, tools=tools,
        input=[{"role": "user", "content": "Look up 'the'."},
               {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": "the: an article"}])
    answer = raw.parse()
    record("tool_result", answer.usage, raw.headers, item=answer.output[0].type, text=answer.output_text)

    raw = client.responses.with_raw_response.create(model=MODEL, input="And again?",
                                                    previous_response_id=first.id)
    follow = raw.parse()
    record("follow_up", follow.usage, raw.headers, status=follow.status)
elif mode == "cutoff" and sys.argv[2] == "create":
    raised = None
    last = None
    try:
        for ev in client.responses.create(model=MODEL, input="Write a long story.", stream=True):
            last = ev
    except Exception as e:  # noqa: BLE001 - the test asserts on it
        raised = type(e).__name__
    out["create"] = {"raised": raised, "last": last.type if last else None,
                     "status": last.response.status if last and hasattr(last, "response") else None,
                     "usage": last.response.usage.model_dump() if last and hasattr(last, "response") and last.response.usage else None}
elif mode == "cutoff":
    raised, last, final_error = None, None, None
    try:
        with client.responses.stream(model=MODEL, input="Write a long story.") as s:
            for ev in s:
                last = ev
            try:
                s.get_final_response()
            except Exception as e:  # noqa: BLE001 - raises by SDK design on non-completed responses
                final_error = type(e).__name__
    except Exception as e:  # noqa: BLE001
        raised = type(e).__name__
    out["helper"] = {"raised": raised, "last": last.type if last else None,
                     "usage": last.response.usage.model_dump() if last and hasattr(last, "response") and last.response.usage else None,
                     "final_response_error": final_error}
elif mode == "error":
    raised = None
    try:
        for _ in client.responses.create(model=MODEL, input="Say something.", stream=True):
            pass
    except openai.APIError as e:
        raised = {"type": type(e).__name__, "is_api_error": True, "message": str(e)}
    except Exception as e:  # noqa: BLE001
        raised = {"type": type(e).__name__, "is_api_error": False, "message": str(e)}
    out["raised"] = raised
print(json.dumps(out))
