#!/usr/bin/env python3
"""One case of scripts/clients_latest.py for a Python SDK:
`clients_latest_sdk.py <client> <case>` against BASE_URL with API_KEY.
Exit 0: the client saw what the case expects; 1: it did not (the error is
printed); 2: the case does not apply to the client."""
import os
import sys

BASE, KEY = os.environ["BASE_URL"], os.environ["API_KEY"]
HI = [{"role": "user", "content": "say hi"}]


def openai_py(case):
    import openai
    c = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY)
    if case in ("streamed", "cutoff"):
        finish = None
        for ch in c.chat.completions.create(model="gpt-4o-mini", messages=HI, stream=True):
            if ch.choices and ch.choices[0].finish_reason:
                finish = ch.choices[0].finish_reason
        print("finish_reason", finish)
        return 0 if finish else 1
    if case == "uncapped":
        r = c.chat.completions.create(model="gpt-4o-mini", messages=HI)
        print(r.choices[0].finish_reason, r.usage.completion_tokens)
        return 0 if r.choices[0].finish_reason == "stop" and r.usage.completion_tokens >= 2000 else 1
    if case == "tool-agent":
        return 2
    r = c.chat.completions.create(model="gpt-4o-mini", messages=HI, max_tokens=64)
    print(r.choices[0].message.content)
    return 0


def anthropic_py(case):
    import anthropic
    c = anthropic.Anthropic(base_url=BASE, api_key=KEY)
    if case in ("uncapped", "tool-agent"):
        return 2  # Messages requires max_tokens
    if case in ("streamed", "cutoff"):
        with c.messages.stream(model="claude-sonnet-4-5", max_tokens=30000, messages=HI) as s:
            m = s.get_final_message()
        print("stop_reason", m.stop_reason)
        return 0
    m = c.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=HI)
    print(m.content[0].text)
    return 0


def openai_agents(case):
    import agents
    import openai
    agents.set_default_openai_client(openai.AsyncOpenAI(base_url=BASE + "/v1", api_key=KEY))
    agents.set_tracing_disabled(True)

    @agents.function_tool
    def budget_left(tenant: str) -> str:
        """How many tokens a tenant has left today."""
        return "1000"

    tools = [budget_left] if case == "tool-agent" else []
    agent = agents.Agent(name="hi", instructions="Answer briefly.", model="gpt-4o-mini", tools=tools)
    if case in ("streamed", "cutoff"):
        import asyncio

        async def streamed():
            r = agents.Runner.run_streamed(agent, "say hi")
            async for _ in r.stream_events():
                pass
            return r.final_output
        print(asyncio.run(streamed()))
        return 0
    r = agents.Runner.run_sync(agent, "say hi")
    out = r.final_output
    print(len(out.split()), "words")
    if case == "uncapped":
        return 0 if len(out.split()) >= 2000 else 1
    return 0


def langchain_openai(case):
    from langchain_openai import ChatOpenAI
    if case == "tool-agent":
        return 2
    kw = {} if case in ("uncapped", "streamed", "cutoff") else {"max_tokens": 64}
    m = ChatOpenAI(model="gpt-4o-mini", base_url=BASE + "/v1", api_key=KEY, **kw)
    if case in ("streamed", "cutoff"):
        text = "".join(ch.content for ch in m.stream("say hi"))
        print(len(text.split()), "words")
        return 0
    r = m.invoke("say hi")
    print(r.response_metadata.get("finish_reason"), len(r.content.split()), "words")
    if case == "uncapped":
        return 0 if r.response_metadata.get("finish_reason") == "stop" and len(r.content.split()) >= 2000 else 1
    return 0


CLIENTS = {"openai-py": openai_py, "anthropic-py": anthropic_py, "openai-agents": openai_agents,
           "langchain-openai": langchain_openai}

if __name__ == "__main__":
    try:
        sys.exit(CLIENTS[sys.argv[1]](sys.argv[2]))
    except Exception as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
