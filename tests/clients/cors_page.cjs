// A page of another origin calls troupe's HTTP API from headless Chromium (playwright-core):
// tests/access_test.cpp runs it to see CORS as a browser enforces it. The page at ORIGIN (served
// by the script itself through a route: nothing listens there) streams a greedy completion from
// URL with the API key KEY, reading the server-sent events as they come, and the script prints
// one JSON object: {text} when the browser let the page read the answer, {error} when it did not.
// The certificate of an HTTPS URL is not checked (the test's CA is not the browser's), and
// Chromium's Local Network Access checks are off: they would stop a page of a routed origin
// from calling a loopback address before CORS is even asked (a real front-end is served from a
// real address).
//
//   node cors_page.cjs URL CHROMIUM ORIGIN KEY PROMPT MAX_TOKENS
const { chromium } = require('playwright-core');

const [url, chromiumPath, origin, key, prompt, maxTokens] = process.argv.slice(2);

async function stream({ url, key, prompt, maxTokens }) {
  try {
    const res = await fetch(url + '/v1/completions', {
      method: 'POST',
      headers: { Authorization: 'Bearer ' + key, 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, stream: true }),
    });
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let events = '';
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      events += decoder.decode(value, { stream: true });
    }
    let text = '';
    for (const line of events.split('\n')) {
      if (line.startsWith('data: {')) text += JSON.parse(line.slice(6)).choices?.[0]?.text ?? '';
    }
    return { status: res.status, text };
  } catch (e) {
    return { error: String(e) };
  }
}

async function main() {
  const browser = await chromium.launch({ executablePath: chromiumPath, args: ['--no-sandbox', '--disable-features=LocalNetworkAccessChecks'] });
  try {
    const context = await browser.newContext({ ignoreHTTPSErrors: true });
    const page = await context.newPage();
    await page.route(origin + '/**', (route) =>
      route.fulfill({ status: 200, contentType: 'text/html; charset=utf-8', body: '<!doctype html><title>other origin</title>' }));
    await page.goto(origin + '/');
    console.log(JSON.stringify(await page.evaluate(stream, { url, key, prompt, maxTokens: Number(maxTokens) })));
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
