"""Drives the gateway with the official openai SDK: chat, streamed chat,
embeddings, models.list. Prints one JSON line with what it saw."""
import json
import os
import sys

import openai

client = openai.OpenAI(base_url=os.environ["BASE_URL"], api_key=os.environ["API_KEY"], max_retries=0)
msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]

raw = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=msgs, max_tokens=12)
chat = raw.parse()
stream = client.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=12, stream=True)
parts, finish, usage_chunks = [], None, 0
for chunk in stream:
    if chunk.usage is not None:
        usage_chunks += 1
    for c in chunk.choices:
        if c.delta.content:
            parts.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
emb = client.embeddings.create(model="text-embedding-3-small", input=["hello world", "second"])
models = [m.id for m in client.models.list()]
print(json.dumps({
    "chat_content": chat.choices[0].message.content,
    "chat_usage": chat.usage.total_tokens,
    "chat_headers": {k: v for k, v in raw.headers.items() if k.startswith("x-")},
    "stream_content": "".join(parts),
    "stream_finish": finish,
    "stream_usage_chunks": usage_chunks,
    "embeddings": len(emb.data),
    "embedding_dims": len(emb.data[0].embedding),
    "models": models,
}))
