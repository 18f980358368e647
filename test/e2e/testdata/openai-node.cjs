// The official openai npm package against the fleet's gateway (TestAPIThroughGateway).
// Every check throws on a wrong answer; the last line says all passed.
const { default: OpenAI, BadRequestError } = require("openai");

const client = new OpenAI({ maxRetries: 0 });
const model = process.env.MODEL;
const weather = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather for a city",
    parameters: {
      type: "object",
      properties: { city: { type: "string", maxLength: 24 } },
      required: ["city"],
      additionalProperties: false,
    },
  },
};

function check(ok, what, value) {
  if (!ok) throw new Error(`${what}: ${JSON.stringify(value)}`);
  console.log(`ok: ${what}`);
}

async function main() {
  // A forced tool call, streamed: the SDK reassembles the deltas.
  const question = { role: "user", content: "Weather in Paris?" };
  const stream = client.chat.completions.stream({
    model, max_tokens: 64, seed: 2, tools: [weather], tool_choice: "required",
    parallel_tool_calls: false, messages: [question],
  });
  const called = await stream.finalChatCompletion();
  const call = called.choices[0].message.tool_calls?.[0];
  check(called.choices[0].finish_reason === "tool_calls" && call?.function.name === "get_weather",
    "streamed tool call", called.choices[0]);
  const args = JSON.parse(call.function.arguments);
  check(typeof args.city === "string" && [...args.city].length <= 24, "tool arguments match the schema", args);

  // The result goes back; the model answers.
  const answer = await client.chat.completions.create({
    model, max_tokens: 16, seed: 2, tools: [weather],
    messages: [question, called.choices[0].message,
      { role: "tool", tool_call_id: call.id, content: '{"temperature": 21}' }],
  });
  check(answer.usage.prompt_tokens > called.usage?.prompt_tokens || answer.usage.prompt_tokens > 0,
    "answer after the tool result", answer.usage);

  // Strict structured output.
  const schema = {
    type: "object",
    properties: { title: { type: "string", maxLength: 20 }, stars: { type: "integer", minimum: 1, maximum: 5 } },
    required: ["title", "stars"], additionalProperties: false,
  };
  for (let seed = 0; seed < 5; seed++) {
    const r = await client.chat.completions.create({
      model, max_tokens: 120, seed, messages: [{ role: "user", content: "Review a film." }],
      response_format: { type: "json_schema", json_schema: { name: "review", strict: true, schema } },
    });
    const v = JSON.parse(r.choices[0].message.content);
    check(Object.keys(v).sort().join() === "stars,title" && Number.isInteger(v.stars) && v.stars >= 1 &&
      v.stars <= 5 && [...v.title].length <= 20, `json_schema seed ${seed}`, v);
  }

  // Logprobs and two choices.
  const two = await client.chat.completions.create({
    model, max_tokens: 5, n: 2, logprobs: true, top_logprobs: 3, messages: [{ role: "user", content: "Hi" }],
  });
  check(two.choices.length === 2 && two.choices.every((c) => c.logprobs.content.length > 0 &&
    c.logprobs.content[0].top_logprobs.length === 3), "n: 2 with logprobs", two.choices.map((c) => c.logprobs));

  // A field that is not served is refused by name.
  try {
    await client.chat.completions.create({ model, logit_bias: { 1: 5 }, messages: [{ role: "user", content: "x" }] });
    check(false, "logit_bias refused", "accepted");
  } catch (e) {
    check(e instanceof BadRequestError && e.param === "logit_bias", "logit_bias refused with a 400 naming it",
      { status: e.status, param: e.param, message: e.message });
  }
  // The Responses API: text, a stream the SDK assembles, a forced function call.
  const resp = await client.responses.create({ model, input: "Hello", instructions: "Be brief.", max_output_tokens: 12 });
  check(resp.output_text.length > 0 && resp.usage.input_tokens > 0, "responses: text", resp.output);
  const rs = client.responses.stream({ model, input: "Hello", max_output_tokens: 12 });
  let deltas = "";
  rs.on("response.output_text.delta", (e) => { deltas += e.delta; });
  const final = await rs.finalResponse();
  // The stream helper's final response has no output_text: join the message parts.
  const streamed = final.output.filter((i) => i.type === "message").flatMap((i) => i.content).map((c) => c.text).join("");
  check(deltas.length > 0 && streamed === deltas, "responses: stream", { deltas, streamed });
  const called2 = await client.responses.create({
    model, input: "Weather in Paris?", max_output_tokens: 200, tool_choice: "required", parallel_tool_calls: false,
    tools: [{ type: "function", name: "get_weather", strict: true, parameters: weather.function.parameters }],
  });
  const fc = called2.output.find((i) => i.type === "function_call");
  check(fc && fc.name === "get_weather" && typeof JSON.parse(fc.arguments).city === "string", "responses: function call", called2.output);
  console.log("all checks passed");
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
