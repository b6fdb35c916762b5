"""Client disconnects: opens a streamed chat completion `argv[1]` times,
reads only the first chunk and closes the connection; then starts one more
stream at once (no retries, no waiting) and reads its first chunk.
Prints one JSON line with how many were admitted and what the last got."""
import json
import os
import sys

import openai

client = openai.OpenAI(base_url=os.environ["BASE_URL"], api_key=os.environ["API_KEY"], max_retries=0)
msgs = [{"role": "user", "content": "Tell me a long story."}]
rounds = int(sys.argv[1])
admitted, refused = 0, []
for _ in range(rounds):
    try:
        stream = client.chat.completions.create(model="gpt-4o-mini", messages=msgs, stream=True)
        next(iter(stream))
        stream.close()  # closes the HTTP connection mid-stream
        admitted += 1
    except openai.RateLimitError as e:
        refused.append(str(e))
final = None
try:
    stream = client.chat.completions.create(model="gpt-4o-mini", messages=msgs, stream=True)
    first = next(iter(stream))
    stream.close()
    final = {"ok": True, "id": first.id}
except openai.APIStatusError as e:
    final = {"ok": False, "status": e.status_code, "message": str(e)}
print(json.dumps({"admitted": admitted, "refused": refused, "final": final}))
