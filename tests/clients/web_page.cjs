// Drives troupe's web page (GET /) in headless Chromium with playwright-core (tests/http_test.cpp
// runs it with NODE_PATH at the packages scripts/npm-deps.sh installed): types a prompt and the
// sampling controls, presses Generate, waits for the stream to end and prints one JSON object
// with the streamed text, the reported seed and any error the page shows.
const { chromium } = require('playwright-core');

const [url, chromiumPath, prompt, maxTokens, seed] = process.argv.slice(2);

async function main() {
  const browser = await chromium.launch({ executablePath: chromiumPath, args: ['--no-sandbox'] });
  try {
    const page = await browser.newPage();
    await page.goto(url + '/');
    await page.fill('#prompt', prompt);
    await page.fill('#max_tokens', maxTokens);
    await page.fill('#temperature', '0');
    await page.fill('#seed', seed);
    await page.click('#generate');
    await page.waitForSelector('#status[data-state="done"]', { state: 'attached', timeout: 60000 });
    const text = async (selector) => page.textContent(selector);
    const result = { completion: await text('#completion'), seed: await text('#reported_seed'), error: await text('#error') };
    process.stdout.write(JSON.stringify(result) + '\n');
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  process.stderr.write(String(e.stack || e) + '\n');
  process.exit(1);
});
