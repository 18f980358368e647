// The official openai and Anthropic npm clients, with their own retries, against a
// key whose TokenBudget is spent for the minute (TestBudgetSDKsRetryAfterTheReset):
// the first answer is a 429 with Retry-After, the client waits it out and is served.
// SDK says which client; the last line says all checks passed.

function check(ok, what, value) {
  if (!ok) throw new Error(`${what}: ${JSON.stringify(value)}`);
  console.log(`ok: ${what}`);
}

async function main() {
  const statuses = [];
  const logged = async (url, init) => {
    const r = await fetch(url, init);
    statuses.push(r.status);
    console.log(`${r.status} retry-after=${r.headers.get("retry-after")} at ${new Date().toISOString()}`);
    return r;
  };
  const started = Date.now();
  const model = process.env.MODEL;
  if (process.env.SDK === "anthropic") {
    const { default: Anthropic } = require("@anthropic-ai/sdk");
    const client = new Anthropic({
      baseURL: process.env.ANTHROPIC_BASE_URL, apiKey: process.env.OPENAI_API_KEY, maxRetries: 3, fetch: logged,
    });
    const m = await client.messages.create({ model, max_tokens: 4, messages: [{ role: "user", content: "Hello" }] });
    check(m.type === "message" && m.content.length > 0, "a message after the reset", m);
  } else {
    const { default: OpenAI } = require("openai");
    const client = new OpenAI({ maxRetries: 3, fetch: logged });
    const r = await client.chat.completions.create({ model, max_tokens: 4, messages: [{ role: "user", content: "Hello" }] });
    check(r.choices?.[0]?.message !== undefined, "a completion after the reset", r);
  }
  check(statuses[0] === 429 && statuses[statuses.length - 1] === 200, "refused first, served after retrying", statuses);
  console.log(`served after ${Date.now() - started} ms`);
  console.log("all checks passed");
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
