// The official `openai` npm client against troupe's HTTP gateway (tests/http_test.cpp runs it
// with NODE_PATH at the packages scripts/npm-deps.sh installed). Prints one JSON object: the
// text it streamed for a greedy completion and chat completion, and for the same seeded request
// twice alone and once among 32 other streams; the texts of an n = 3 seeded completion by index;
// and a greedy chat completion's logprobs: its tokens joined, and whether each token is its own
// top alternative with the same logprob.
const OpenAI = require('openai');

const [baseURL, prompt, maxTokens] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'unused' });
const max_tokens = Number(maxTokens);
const model = 'stories260K';

async function streamed(request, pick) {
  let text = '';
  for await (const chunk of await request) text += pick(chunk) ?? '';
  return text;
}

const completionText = (c) => c.choices[0]?.text;
const seededRequest = () =>
  streamed(client.completions.create({ model, prompt, max_tokens, temperature: 1, seed: 42, stream: true }), completionText);

async function main() {
  const completion = await streamed(
    client.completions.create({ model, prompt, max_tokens, temperature: 0, stream: true }), completionText);
  const chat = await streamed(
    client.chat.completions.create({ model, messages: [{ role: 'user', content: prompt }], max_tokens, temperature: 0, stream: true }),
    (c) => c.choices[0]?.delta?.content);
  const seeded = [await seededRequest(), await seededRequest()];
  const others = Array.from({ length: 32 }, (_, i) =>
    streamed(client.completions.create({ model, prompt: `Story ${i}:`, max_tokens, stream: true }), completionText));
  const [underLoad] = await Promise.all([seededRequest(), ...others]);
  const several = await client.completions.create({ model, prompt, max_tokens, temperature: 1, seed: 42, n: 3 });
  const n = several.choices.sort((a, b) => a.index - b.index).map((c) => c.text);
  const scored = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: prompt }], max_tokens, temperature: 0, logprobs: true, top_logprobs: 2 });
  const content = scored.choices[0].logprobs.content;
  const logprobs = {
    text: content.map((t) => t.token).join(''),
    topIsChosen: content.every((t) => t.top_logprobs[0].token === t.token && t.top_logprobs[0].logprob === t.logprob),
  };
  console.log(JSON.stringify({ completion, chat, seeded, underLoad, n, logprobs }));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
