// Two agent SDKs against the fleet's gateway serving the trained test model
// (TestSDKToolLoops): SDK=agents is the @openai/agents package, SDK=ai the ai package
// with its @ai-sdk/openai provider. Each runs a tool loop (the model calls the tool, the SDK runs it and sends the
// result, the model answers) to a final output that carries the tool's result, then
// asks for a structured answer 10 times at the SDK's default limits and parses each.
// The loops are greedy (temperature 0): sampled at the default temperature the model
// now and then calls a tool of its training corpus (get_current_weather) instead of
// the one offered, which the SDK rightly refuses (1 of 6 loops, measured).
// Every check throws on a wrong answer; the last line says all passed.
const { z } = require("zod");

const model = process.env.MODEL;
const sdk = process.env.SDK;
const question = "What is the weather in Warsaw?";
// What the tool answers; the final output must carry both values, which the model
// cannot know without it.
const reading = { temperature: 17, condition: "foggy" };
const asked = [];

function check(ok, what, value) {
  if (!ok) throw new Error(`${what}: ${JSON.stringify(value)}`);
  console.log(`ok: ${what}`);
}

function weatherResult(city) {
  asked.push(city);
  return `${reading.temperature}°C and ${reading.condition}`;
}

function checkLoop(final) {
  console.log(`final output: ${JSON.stringify(final)}`);
  check(asked.length === 1 && asked[0] === "Warsaw", "the SDK ran the tool once, for the city asked about", asked);
  check(typeof final === "string" && new RegExp(`\\b${reading.temperature}\\b`).test(final) && final.includes(reading.condition),
    "the final output carries the tool's result", final);
}

const Capital = z.object({ country: z.string(), capital: z.string() });

function checkObjects(objects) {
  const parsed = objects.filter((o) => Capital.safeParse(o).success && o.country === "Chile");
  check(parsed.length === 10, "10 of 10 structured answers parse", objects);
}

async function agents() {
  const { Agent, run, tool, setTracingDisabled } = require("@openai/agents");
  // Else it exports traces to the vendor's API.
  setTracingDisabled(true);
  // The SDK's default tool: a zod schema, sent with strict: true under tool_choice
  // auto, which the runner holds to the schema once the model opens a call.
  const getWeather = tool({
    name: "get_weather",
    description: "Get the current weather for a city.",
    parameters: z.object({ city: z.string().describe("The city name") }),
    execute: async ({ city }) => weatherResult(city),
  });
  check(getWeather.strict === true, "the SDK's default tool is strict", getWeather.strict);
  const agent = new Agent({ name: "Assistant", model, tools: [getWeather], modelSettings: { temperature: 0 } });
  const result = await run(agent, question, { maxTurns: 4 });
  checkLoop(result.finalOutput);

  const json = new Agent({ name: "Assistant", model, outputType: Capital });
  const objects = [];
  for (let i = 0; i < 10; i++) {
    // A reply that does not parse fails the run; its error counts as that answer.
    objects.push(await run(json, "Return a JSON object with the country and capital of Chile.")
      .then((r) => r.finalOutput, (err) => String(err)));
  }
  checkObjects(objects);
}

async function ai() {
  const { generateText, generateObject, tool, stepCountIs } = require("ai");
  const { createOpenAI } = require("@ai-sdk/openai");
  const provider = createOpenAI({ baseURL: process.env.OPENAI_BASE_URL, apiKey: process.env.OPENAI_API_KEY });
  const result = await generateText({
    model: provider(model),
    maxRetries: 0,
    tools: {
      get_weather: tool({
        description: "Get the current weather for a city.",
        inputSchema: z.object({ city: z.string().describe("The city name") }),
        execute: async ({ city }) => weatherResult(city),
      }),
    },
    stopWhen: stepCountIs(4),
    temperature: 0,
    prompt: question,
  });
  checkLoop(result.text);

  const objects = [];
  for (let i = 0; i < 10; i++) {
    // A reply that does not parse throws; its error counts as that answer.
    objects.push(await generateObject({
      model: provider(model), maxRetries: 0, schema: Capital,
      prompt: "Return a JSON object with the country and capital of Chile.",
    }).then((r) => r.object, (err) => String(err)));
  }
  checkObjects(objects);
}

const run = { agents, ai }[sdk];
if (!run) throw new Error(`SDK=${sdk}: want agents or ai`);
run().then(() => console.log(`all checks passed (${sdk})`), (err) => {
  console.error(err);
  process.exit(1);
});
