"""The official `google-genai` SDK (pinned) against the gateway's Gemini routes.

Usage: gemini_sdk.py MODE [MODEL]; prints one JSON line. BASE_URL is the
gateway's root; API_KEY the gateway key (sent by the SDK as x-goog-api-key).
Modes: basic (generate, stream, count tokens, a function call),
rate_limited (one call; reports the SDK's error), cutoff (a stream the
gateway cuts off: the chunks, the last finish reason and usage).
"""
import json
import os
import sys

from google import genai
from google.genai import errors, types

mode = sys.argv[1]
model = sys.argv[2] if len(sys.argv) > 2 else "gemini-test"
base = os.environ["BASE_URL"].removesuffix("/v1")
client = genai.Client(api_key=os.environ["API_KEY"], http_options=types.HttpOptions(base_url=base))
prompt = "Say hello to the budget gate"
out = {}

if mode == "basic":
    r = client.models.generate_content(
        model=model, contents=prompt, config=types.GenerateContentConfig(max_output_tokens=64))
    out["text"] = r.text
    out["finish"] = r.candidates[0].finish_reason.name
    out["usage"] = r.usage_metadata.model_dump(exclude_none=True, mode="json")
    text, last = "", None
    for chunk in client.models.generate_content_stream(
            model=model, contents=prompt, config=types.GenerateContentConfig(max_output_tokens=64)):
        text += chunk.text or ""
        last = chunk
    out["stream_text"] = text
    out["stream_finish"] = last.candidates[0].finish_reason.name
    out["stream_usage"] = last.usage_metadata.model_dump(exclude_none=True, mode="json")
    out["count"] = client.models.count_tokens(model=model, contents=prompt).total_tokens
    weather = types.FunctionDeclaration(
        name="get_weather", description="Weather by city",
        parameters=types.Schema(type="OBJECT", properties={"location": types.Schema(type="STRING")}))
    r = client.models.generate_content(
        model=model, contents="What is the weather in Boston?",
        config=types.GenerateContentConfig(
            tools=[types.Tool(function_declarations=[weather])],
            tool_config=types.ToolConfig(
                function_calling_config=types.FunctionCallingConfig(mode="ANY")),
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True)))
    call = r.function_calls[0]
    out["function_call"] = {"name": call.name, "args": dict(call.args)}
elif mode == "rate_limited":
    try:
        client.models.generate_content(model=model, contents=prompt)
        out["error"] = None
    except errors.APIError as e:
        out["error"] = {"code": e.code, "status": e.status, "message": e.message,
                        "details": e.details}
elif mode == "cutoff":
    n, last = 0, None
    for chunk in client.models.generate_content_stream(model=model, contents=prompt):
        n += 1
        last = chunk
    out["chunks"] = n
    out["finish"] = last.candidates[0].finish_reason.name
    out["usage"] = last.usage_metadata.model_dump(exclude_none=True, mode="json")
print(json.dumps(out))
