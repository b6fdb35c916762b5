// One case of scripts/clients_latest.py for a Node SDK:
// `node clients_latest_sdk.mjs <client> <case>` against BASE_URL with
// API_KEY (run in the prefix's npm directory). Exit 0: the client saw
// what the case expects; 1: it did not; 2: the case does not apply.
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

const [client, kase] = process.argv.slice(2);
const base = process.env.BASE_URL;
const key = process.env.API_KEY;
const hi = [{ role: "user", content: "say hi" }];

async function openai() {
  const c = new OpenAI({ baseURL: `${base}/v1`, apiKey: key });
  if (kase === "tool-agent") return 2;
  if (kase === "streamed" || kase === "cutoff") {
    let finish = null;
    const s = await c.chat.completions.create({ model: "gpt-4o-mini", messages: hi, stream: true });
    for await (const ch of s) finish = ch.choices[0]?.finish_reason ?? finish;
    console.log("finish_reason", finish);
    return finish ? 0 : 1;
  }
  if (kase === "uncapped") {
    const r = await c.chat.completions.create({ model: "gpt-4o-mini", messages: hi });
    console.log(r.choices[0].finish_reason, r.usage.completion_tokens);
    return r.choices[0].finish_reason === "stop" && r.usage.completion_tokens >= 2000 ? 0 : 1;
  }
  const r = await c.chat.completions.create({ model: "gpt-4o-mini", messages: hi, max_tokens: 64 });
  console.log(r.choices[0].message.content);
  return 0;
}

async function anthropic() {
  const c = new Anthropic({ baseURL: base, apiKey: key });
  if (kase === "uncapped" || kase === "tool-agent") return 2; // Messages requires max_tokens
  if (kase === "streamed" || kase === "cutoff") {
    const m = await c.messages.stream({ model: "claude-sonnet-4-5", max_tokens: 30000, messages: hi }).finalMessage();
    console.log("stop_reason", m.stop_reason);
    return 0;
  }
  const m = await c.messages.create({ model: "claude-sonnet-4-5", max_tokens: 64, messages: hi });
  console.log(m.content[0].text);
  return 0;
}

const run = { openai, "@anthropic-ai/sdk": anthropic }[client];
run().then(
  (code) => process.exit(code),
  (e) => {
    console.error(`${e.constructor.name}: ${e.message}`);
    process.exit(1);
  },
);
