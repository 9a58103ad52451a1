// A tool-calling round trip against troupe (tests/tool_calling_test.cpp runs it with NODE_PATH at
// the packages scripts/npm-deps.sh installs): with the official `openai` client, tool_choice
// "required" and a named function, whole and streamed, then the call's result sent back as a
// `role: "tool"` message and the final answer, whole and streamed; and the same round trip over
// the msgpack protocol (examples/clients/msgpack_client.mjs). The model is the one GET /v1/models
// lists first. Greedy throughout. Prints one JSON object with what each step got.
//
//   node tests/clients/openai_tools.mjs http://127.0.0.1:PORT/v1 127.0.0.1:MSGPACK_PORT
import { createRequire } from 'node:module';
import { TroupeClient } from '../../examples/clients/msgpack_client.mjs';

// Resolved through NODE_PATH as well as node_modules (an ES import ignores NODE_PATH).
const OpenAI = createRequire(import.meta.url)('openai');

const [baseURL, msgpackAddress] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'unused' });
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer' } },
      required: ['city'],
    },
  },
}];
const question = { role: 'user', content: 'What is the weather in Paris?' };
const request = { model: '', tools, temperature: 0, max_tokens: 300, parallel_tool_calls: false };
const named = { type: 'function', function: { name: 'get_weather' } };

const callOf = (c) => ({ id: c.id, type: c.type, name: c.function.name, arguments: c.function.arguments });

async function whole(tool_choice) {
  const r = await client.chat.completions.create({ ...request, messages: [question], tool_choice });
  const c = r.choices[0];
  return { finish: c.finish_reason, content: c.message.content, calls: (c.message.tool_calls ?? []).map(callOf) };
}

/// The calls a stream sends, put together by index as a client does: the first delta of a call
/// has its id, type and name, the next ones more of its arguments.
async function streamed(tool_choice) {
  const stream = await client.chat.completions.create({ ...request, messages: [question], tool_choice, stream: true });
  const calls = [];
  let finish = null, content = '', numFragments = 0, numEmpty = 0;
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    if (!choice.delta.tool_calls && !choice.delta.role && !choice.finish_reason) numEmpty++;
    for (const d of choice.delta.tool_calls ?? []) {
      if (d.id) calls[d.index] = { id: d.id, type: d.type, name: d.function.name, arguments: d.function.arguments };
      else calls[d.index].arguments += d.function.arguments, numFragments++;
    }
    content += choice.delta.content ?? '';
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  return { finish, content, calls, numFragments, numEmpty };
}

/// The second turn: the call and its result go back; the final answer, whole and streamed.
async function answer(call) {
  const messages = [
    question,
    { role: 'assistant', content: null,
      tool_calls: [{ id: call.id, type: 'function', function: { name: call.name, arguments: call.arguments } }] },
    { role: 'tool', tool_call_id: call.id, content: JSON.stringify({ temperature: 18, unit: 'C' }) },
  ];
  const w = await client.chat.completions.create({ ...request, messages, max_tokens: 24 });
  const stream = await client.chat.completions.create({
    ...request, messages, max_tokens: 24, stream: true, stream_options: { include_usage: true } });
  let content = '', finish = null, numChunks = 0, usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const choice = chunk.choices[0];
    if (!choice) continue;
    numChunks++;
    content += choice.delta.content ?? '';
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  return {
    whole: { content: w.choices[0].message.content, finish: w.choices[0].finish_reason, usage: w.usage },
    streamed: { content, finish, numChunks, usage },
    messages,
  };
}

/// The same over msgpack: a forced choice's chunks carry whole calls.
async function overMsgpack(firstCall) {
  const [host, port] = [msgpackAddress.slice(0, msgpackAddress.lastIndexOf(':')),
    Number(msgpackAddress.slice(msgpackAddress.lastIndexOf(':') + 1))];
  const c = await TroupeClient.connect(host, port);
  const base = { tools: JSON.stringify(tools), temperature: 0, max_tokens: 300, parallel_tool_calls: false };
  const calls = [];
  const first = await c.complete({ ...base, messages: [question], tool_choice: 'required' },
    (frame) => calls.push(...(frame.tool_calls ?? [])));
  // The second turn's messages as the protocol takes them: strings, the calls as JSON text.
  const messages = [
    question,
    { role: 'assistant', content: '', tool_calls: JSON.stringify([{ id: firstCall.id, type: 'function',
      function: { name: firstCall.name, arguments: firstCall.arguments } }]) },
    { role: 'tool', tool_call_id: firstCall.id, content: JSON.stringify({ temperature: 18, unit: 'C' }) },
  ];
  const second = await c.complete({ ...base, messages, tool_choice: 'auto', max_tokens: 24 });
  c.close();
  return {
    calls, text: first.text, finish: first.end.finish_reason,
    second: { text: second.text, finish: second.end.finish_reason, promptTokens: second.end.usage.prompt_tokens },
  };
}

async function main() {
  request.model = (await client.models.list()).data[0].id;
  const required = { whole: await whole('required'), streamed: await streamed('required') };
  const namedCall = { whole: await whole(named), streamed: await streamed(named) };
  const second = await answer(required.whole.calls[0]);
  const msgpack = await overMsgpack(required.whole.calls[0]);
  console.log(JSON.stringify({ tools, required, named: namedCall, second, msgpack }));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
