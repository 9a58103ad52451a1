// Drives troupe's web page (GET /) in headless Chromium with playwright-core (tests/http_test.cpp
// runs it with NODE_PATH at the packages scripts/npm-deps.sh installed). Two modes:
//
//   live URL CHROMIUM SYSTEM MAX_TOKENS SEED USER_TEXT...
//     chats with the troupe at URL, greedy: sets the system prompt and the controls, sends each
//     user text after the answer to the one before, and prints one JSON object: the messages the
//     page shows ([role, text, state]), the raw bodies of its chat requests, the reported seed,
//     the error shown, the number of img elements and the document's title.
//   canned URL CHROMIUM
//     serves the page troupe serves at URL from a stand-in API whose answers this script writes
//     piece by piece (reasoning, a tool call, HTML-looking text, a held stream to stop, errors),
//     checks what the page shows and sends after each, and prints the checks that passed.
const assert = require('node:assert/strict');
const http = require('node:http');
const { chromium } = require('playwright-core');

const [mode, url, chromiumPath, ...rest] = process.argv.slice(2);

/// Waits until the k-th answer (1-based) has finished streaming, whatever the outcome.
async function answered(page, k) {
  const selector = `#messages > li:nth-child(${2 * k})[data-state]:not([data-state="streaming"])`;
  await page.waitForSelector(selector, { state: 'attached', timeout: 60000 });
}

/// What the page shows: each message's role, state, content, reasoning and tool calls, and
/// whatever else a test must see (error, seed, img elements, title).
async function shown(page) {
  return page.evaluate(() => ({
    messages: [...document.querySelectorAll('#messages > li')].map((li) => ({
      role: li.dataset.role,
      state: li.dataset.state || '',
      content: li.querySelector('.content').textContent,
      reasoning: [...li.querySelectorAll('details.reasoning')]
        .map((d) => [d.open, d.querySelector('summary').textContent, d.querySelector('div').textContent]),
      calls: [...li.querySelectorAll('.tool-call')]
        .map((c) => [c.querySelector('.name').textContent, c.querySelector('.arguments').textContent]),
      order: [...li.children].map((c) => c.className),
    })),
    error: document.getElementById('error').textContent,
    seed: document.getElementById('reported_seed').textContent,
    images: document.querySelectorAll('img').length,
    title: document.title,
  }));
}

async function send(page, text) {
  await page.fill('#input', text);
  await page.click('#send');
}

async function live(page) {
  const [system, maxTokens, seed, ...userTexts] = rest;
  const requests = [];
  page.on('request', (r) => { if (r.url().endsWith('/v1/chat/completions')) requests.push(r.postData()); });
  await page.goto(url + '/');
  await page.fill('#system', system);
  await page.fill('#max_tokens', maxTokens);
  await page.fill('#temperature', '0');
  await page.fill('#seed', seed);
  for (let k = 1; k <= userTexts.length; k++) {
    await send(page, userTexts[k - 1]);
    await answered(page, k);
  }
  const s = await shown(page);
  const messages = s.messages.map((m) => [m.role, m.content, m.state]);
  return JSON.stringify({ messages, requests, seed: s.seed, error: s.error, images: s.images, title: s.title });
}

/// A stand-in for troupe's API on a free port: GET / is `html`, GET /v1/models names the model
/// 'canned', and each chat request waits, as {body, res, closed}, for next() and the test's answer.
function cannedApi(html) {
  const arrived = [];
  const waiting = [];
  const server = http.createServer((req, res) => {
    if (req.url === '/') return res.writeHead(200, { 'Content-Type': 'text/html; charset=utf-8' }).end(html);
    if (req.url === '/v1/models') {
      return res.writeHead(200, { 'Content-Type': 'application/json' })
        .end('{"object":"list","data":[{"id":"canned","object":"model"}]}');
    }
    if (req.url !== '/v1/chat/completions') return res.writeHead(404).end();
    let body = '';
    req.on('data', (chunk) => { body += chunk; });
    req.on('end', () => {
      const request = { body: JSON.parse(body), res, closed: new Promise((resolve) => res.on('close', resolve)) };
      if (waiting.length) waiting.shift()(request);
      else arrived.push(request);
    });
  });
  const next = () => (arrived.length ? Promise.resolve(arrived.shift()) : new Promise((resolve) => waiting.push(resolve)));
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => {
    resolve({ server, next, url: `http://127.0.0.1:${server.address().port}` });
  }));
}

const event = (delta) =>
  `data: ${JSON.stringify({ object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: null }] })}\n\n`;
const streamHead = { 'Content-Type': 'text/event-stream' };

/// The bytes of `text` in pieces, cut `offset` bytes after each marker: a cut may fall inside
/// a line or a character.
function cut(text, cuts) {
  const bytes = Buffer.from(text);
  const at = cuts.map(([marker, offset]) => bytes.indexOf(Buffer.from(marker)) + Buffer.byteLength(marker) + offset);
  return [0, ...at].map((from, i) => bytes.subarray(from, i < at.length ? at[i] : bytes.length));
}

async function canned(page) {
  const checks = [];
  const html = await (await fetch(url + '/')).text();
  const api = await cannedApi(html);
  try {
    await page.goto(api.url + '/');

    // Reasoning, HTML-looking text and a tool call, cut inside a line, inside the 'é' of 'café'
    // and inside a fragment of the arguments; the last events end their lines with CRLF.
    const user1 = { role: 'user', content: 'Weather in Paris?' };
    await send(page, user1.content);
    const r1 = await api.next();
    assert.deepEqual(r1.body.messages, [user1]);
    assert.equal(r1.body.model, 'canned');
    assert.equal(r1.body.stream, true);
    const html1 = '<img src=x onerror="document.title=\'pwned\'">';
    const call = { index: 0, id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '' } };
    const crlf = (text) => text.replace(/\n/g, '\r\n');
    const body1 = event({ role: 'assistant', reasoning_content: 'Paris, ' }) +
                  event({ reasoning_content: 'café <b>weather</b>.' }) +
                  event({ content: html1 }) +
                  event({ tool_calls: [call] }) +
                  event({ tool_calls: [{ index: 0, function: { arguments: '{"city":' } }] }) +
                  crlf(event({ tool_calls: [{ index: 0, function: { arguments: ' "Paris"}' } }] })) +
                  crlf('data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"seed":7}\n\n') +
                  crlf('data: [DONE]\n\n');
    const [head, middle, end] = cut(body1, [['caf', 1], ['{\\"ci', 0]]);
    r1.res.writeHead(200, streamHead);
    r1.res.write(head);
    await page.waitForFunction(() => document.querySelector('details.reasoning div')?.textContent === 'Paris, ');
    r1.res.write(middle);
    await page.waitForFunction(() => document.querySelector('.tool-call .name')?.textContent === 'get_weather');
    r1.res.end(end);
    await answered(page, 1);
    let s = await shown(page);
    assert.deepEqual(s.messages[1], {
      role: 'assistant', state: 'done', content: html1,
      reasoning: [[false, 'Reasoning', 'Paris, café <b>weather</b>.']],
      calls: [['get_weather', '{"city": "Paris"}']],
      order: ['role', 'reasoning', 'content', 'tool-call'],
    });
    assert.deepEqual([s.images, s.title, s.seed, s.error], [0, 'troupe', '7', '']);
    assert.equal(await page.locator('#messages b').count(), 0);
    checks.push('reasoning folded above the answer, tool call shown as one, HTML shown as text, cut events joined');

    // The second request carries the first exchange, the tool call included; Stop aborts the
    // stream (the server sees the connection close) and keeps what came.
    const assistant1 = { role: 'assistant', content: html1,
      tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] };
    const user2 = { role: 'user', content: 'And in Rome?' };
    await send(page, user2.content);
    const r2 = await api.next();
    assert.deepEqual(r2.body.messages, [user1, assistant1, user2]);
    r2.res.writeHead(200, streamHead);
    r2.res.write(event({ role: 'assistant', content: 'Rome is' }));
    await page.waitForFunction(() => document.querySelector('#messages > li:nth-child(4) .content').textContent === 'Rome is');
    await page.click('#stop');
    await answered(page, 2);
    await r2.closed;
    assert.equal(r2.res.writableEnded, false);
    s = await shown(page);
    assert.deepEqual([s.messages[3].state, s.messages[3].content, s.error], ['stopped', 'Rome is', '']);
    const disabled = await page.evaluate(() => ['send', 'stop', 'new_chat'].map((id) => document.getElementById(id).disabled));
    assert.deepEqual(disabled, [false, true, false]);
    checks.push('the second request carries the first exchange; Stop aborts the stream and keeps its text');

    // A 400 shows its message; a failure event after the first chunk shows its own; neither
    // exchange is sent again.
    await send(page, 'x');
    const r3 = await api.next();
    r3.res.writeHead(400, { 'Content-Type': 'application/json' })
      .end('{"error":{"message":"\'max_tokens\' is too large","type":"invalid_request_error","param":"max_tokens","code":null}}');
    await answered(page, 3);
    s = await shown(page);
    assert.deepEqual([s.messages[4].state, s.messages[5].state, s.error], ['failed', 'failed', '\'max_tokens\' is too large']);
    await send(page, 'y');
    const r4 = await api.next();
    r4.res.writeHead(200, streamHead);
    r4.res.end(event({ role: 'assistant', content: 'half' }) +
               'data: {"error":{"message":"the engine\'s node was lost"}}\n\ndata: [DONE]\n\n');
    await answered(page, 4);
    s = await shown(page);
    assert.deepEqual([s.messages[7].state, s.messages[7].content, s.error], ['failed', 'half', 'the engine\'s node was lost']);
    const user5 = { role: 'user', content: 'Again' };
    await send(page, user5.content);
    const r5 = await api.next();
    assert.deepEqual(r5.body.messages, [user1, assistant1, user2, { role: 'assistant', content: 'Rome is' }, user5]);
    r5.res.writeHead(200, streamHead).end('data: [DONE]\n\n');
    await answered(page, 5);
    assert.equal((await shown(page)).error, '');
    checks.push('an error response and an error event show their messages and are not sent again');

    // New chat: an empty list, and the next request has only the system prompt and the new text.
    await page.click('#new_chat');
    assert.equal(await page.locator('#messages > li').count(), 0);
    await page.fill('#system', 'Be brief.');
    await send(page, 'Hello');
    const r6 = await api.next();
    assert.deepEqual(r6.body.messages, [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello' }]);
    r6.res.writeHead(200, streamHead).end(event({ role: 'assistant', content: 'Hi.' }) + 'data: [DONE]\n\n');
    await answered(page, 1);
    assert.deepEqual((await shown(page)).messages.map((m) => [m.role, m.content]), [['user', 'Hello'], ['assistant', 'Hi.']]);
    checks.push('New chat starts an empty conversation with the system prompt');
  } finally {
    api.server.closeAllConnections();
    api.server.close();
  }
  return checks.join('\n');
}

async function main() {
  const browser = await chromium.launch({ executablePath: chromiumPath, args: ['--no-sandbox'] });
  try {
    const page = await browser.newPage();
    process.stdout.write((mode === 'live' ? await live(page) : await canned(page)) + '\n');
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  process.stderr.write(String(e.stack || e) + '\n');
  process.exit(1);
});
