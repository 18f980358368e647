// The official Anthropic npm client asks the same question about the same image twice
// (TestVisionThroughTheFleet): an image block with a base64 source. Each answer is
// printed as "message: {text, usage}" for the test to check.

async function main() {
  const { default: Anthropic } = require("@anthropic-ai/sdk");
  const client = new Anthropic({ baseURL: process.env.ANTHROPIC_BASE_URL, apiKey: process.env.OPENAI_API_KEY, maxRetries: 0 });
  for (let i = 0; i < 2; i++) {
    const m = await client.messages.create({
      model: process.env.MODEL, max_tokens: 6, temperature: 0,
      messages: [{ role: "user", content: [
        { type: "image", source: { type: "base64", media_type: "image/png", data: process.env.IMAGE } },
        { type: "text", text: process.env.QUESTION },
      ] }],
    });
    const text = m.content.filter((b) => b.type === "text").map((b) => b.text).join("");
    console.log("message: " + JSON.stringify({ text, usage: m.usage }));
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
