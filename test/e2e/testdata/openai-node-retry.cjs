// The official openai npm package against a gateway whose queue refuses its first
// attempt with a 429 (TestFairQueueUnderOverload): the SDK's own retries, which wait
// the Retry-After the gateway sends, get the request served.
const { default: OpenAI } = require("openai");

async function main() {
  const headers = process.env.PRIORITY ? { "X-Macfleet-Priority": process.env.PRIORITY } : {};
  const client = new OpenAI({ maxRetries: 5, defaultHeaders: headers });
  const started = Date.now();
  const r = await client.chat.completions.create({
    model: process.env.MODEL, max_tokens: 8, temperature: 0,
    messages: [{ role: "user", content: "Hello" }],
  });
  if (!r.choices?.[0]?.message) throw new Error(`no answer: ${JSON.stringify(r)}`);
  console.log(`served after ${Date.now() - started} ms`);
  console.log("all checks passed");
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
