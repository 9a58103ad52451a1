// The official `openai` npm client against a troupe with API keys (tests/access_test.cpp runs
// it with NODE_PATH at the packages scripts/npm-deps.sh installed, and NODE_EXTRA_CA_CERTS at
// the CA of an HTTPS gateway). Prints one JSON object: the greedy completion whole and streamed,
// or the status and code of the error the client raised.
//
//   node openai_keys.cjs https://127.0.0.1:PORT/v1 KEY PROMPT MAX_TOKENS
const OpenAI = require('openai');

const [baseURL, apiKey, prompt, maxTokens] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

async function main() {
  const model = (await client.models.list()).data[0].id;
  const request = { model, prompt, max_tokens: Number(maxTokens), temperature: 0 };
  const whole = (await client.completions.create(request)).choices[0].text;
  let streamed = '';
  for await (const chunk of await client.completions.create({ ...request, stream: true })) {
    streamed += chunk.choices[0]?.text ?? '';
  }
  return { whole, streamed };
}

main().then(
  (answer) => console.log(JSON.stringify(answer)),
  (e) => {
    if (e.status === undefined) {
      console.error(e);
      process.exit(1);
    }
    console.log(JSON.stringify({ status: e.status, code: e.code, message: e.message }));
  });
