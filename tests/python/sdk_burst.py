"""Fires N chat completions at once with the official SDK (no automatic
retries) and reports how many were admitted and how the refusals looked."""
import json
import os
import sys
import threading

import openai

n = int(sys.argv[1])
client = openai.OpenAI(base_url=os.environ["BASE_URL"], api_key=os.environ["API_KEY"], max_retries=0, timeout=60)
results = [None] * n


def one(i):
    try:
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
        results[i] = {"ok": True}
    except openai.RateLimitError as e:
        h = e.response.headers
        results[i] = {
            "ok": False,
            "status": e.status_code,
            "type": (e.body or {}).get("type"),
            "code": e.code,
            "retry_after": h.get("retry-after"),
            "remaining_tokens": h.get("x-ratelimit-remaining-tokens"),
        }
    except Exception as e:  # noqa: BLE001 - report anything else as a failure
        results[i] = {"ok": False, "error": repr(e)}
    print("done", i, file=sys.stderr, flush=True)


threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(results))
