"""The official SDK's AzureOpenAI client through the gateway's Azure path form."""
import json
import os

import openai

root = os.environ["BASE_URL"]
client = openai.AzureOpenAI(azure_endpoint=root, api_key=os.environ["API_KEY"], api_version="2024-10-21", max_retries=0)
chat = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
parts = []
for chunk in client.chat.completions.create(
    model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
):
    for c in chunk.choices:
        if c.delta and c.delta.content:
            parts.append(c.delta.content)
print(json.dumps({"content": chat.choices[0].message.content, "stream": "".join(parts)}))
