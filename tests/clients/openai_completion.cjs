// The official `openai` npm client's greedy completion from a troupe server, whole and streamed
// (tests/gguf_serve_test.cpp runs it with NODE_PATH at the packages scripts/npm-deps.sh
// installed). The model is the one GET /v1/models lists first. Prints one JSON object: each
// answer's text and finish reason.
//
//   node openai_completion.cjs http://127.0.0.1:PORT/v1 PROMPT MAX_TOKENS
const OpenAI = require('openai');

const [baseURL, prompt, maxTokens] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'unused' });

async function main() {
  const model = (await client.models.list()).data[0].id;
  const request = { model, prompt, max_tokens: Number(maxTokens), temperature: 0 };
  const whole = (await client.completions.create(request)).choices[0];
  const streamed = { text: '', finish_reason: null };
  for await (const chunk of await client.completions.create({ ...request, stream: true })) {
    streamed.text += chunk.choices[0]?.text ?? '';
    streamed.finish_reason = chunk.choices[0]?.finish_reason ?? streamed.finish_reason;
  }
  console.log(JSON.stringify({ whole: { text: whole.text, finish_reason: whole.finish_reason }, streamed }));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
