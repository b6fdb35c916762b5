"""The official openai SDK over HTTPS: trusts only the CA file given as the
first argument (made by the test), sends a chat and a streamed chat, then
shows that a client trusting the system CAs only refuses the certificate.
Prints one JSON line with what it saw."""
import json
import os
import ssl
import sys

import openai

ca_file = sys.argv[1]
client = openai.OpenAI(
    base_url=os.environ["BASE_URL"],
    api_key=os.environ["API_KEY"],
    max_retries=0,
    http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=ca_file)),
)
msgs = [{"role": "user", "content": "Say something."}]
raw = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=msgs, max_tokens=8)
chat = raw.parse()
parts = []
for chunk in client.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=8, stream=True):
    for c in chunk.choices:
        if c.delta.content:
            parts.append(c.delta.content)

untrusted = openai.OpenAI(base_url=os.environ["BASE_URL"], api_key=os.environ["API_KEY"], max_retries=0)
try:
    untrusted.models.list()
    untrusted_error = None
except openai.APIConnectionError as e:
    untrusted_error = repr(e.__cause__ or e)

print(json.dumps({
    "chat_content": chat.choices[0].message.content,
    "remaining_tokens": raw.headers.get("x-ratelimit-remaining-tokens"),
    "stream_content": "".join(parts),
    "untrusted_error": untrusted_error,
}))
