// llama.cpp's side of bench_llama_cpp (npm node-llama-cpp 3.21.1, its prebuilt CPU build, which
// scripts/npm-deps.sh installs): one measurement of one GGUF file per process, printed as one
// JSON line. llama.cpp's defaults otherwise (its f16 KV cache, its batch size).
//
//   node llama_cpp.mjs MODEL MODE THREADS PROMPT [TOKENS] [STREAMS]
//
// MODE:
//   first    load, evaluate PROMPT, take one token and exit at once (the caller times the process
//            from start to exit: start-up to first token); prints {"prompt_tokens"}
//   decode   PROMPT, then TOKENS greedy tokens; prints {"prompt_tokens", "ttft_ms", "decode_tok_s"}:
//            (TOKENS - 1) / the time from the first token to the last
//   prefill  PROMPT, one token; prints {"prompt_tokens", "prefill_ms"}: evaluate to first token
//   streams  STREAMS sequences of one context, each PROMPT with a distinct first word, TOKENS
//            greedy tokens each, all at once (llama.cpp batches them into one decode per step);
//            prints {"tokens", "seconds", "tok_s"}: all sequences' tokens / the wall time
import { existsSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

// An ES import ignores NODE_PATH: find the package there by hand (as tests/clients/llama_oracle.mjs).
const home = (process.env.NODE_PATH ?? "").split(":").map((dir) => join(dir, "node-llama-cpp"))
  .find((dir) => existsSync(join(dir, "package.json")));
if (home === undefined) throw new Error("node-llama-cpp is not in NODE_PATH (scripts/npm-deps.sh installs it)");
const { getLlama } = await import(pathToFileURL(join(home, "dist", "index.js")).href);

const [modelPath, mode, threadsArg, prompt, tokensArg, streamsArg] = process.argv.slice(2);
const threads = Number(threadsArg);
const numTokens = Number(tokensArg ?? 1);
const numStreams = Number(streamsArg ?? 1);

const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath });
const encode = (text) => [...(model.tokens.shouldPrependBosToken ? [model.tokens.bos] : []), ...model.tokenize(text)];
const options = { temperature: 0, yieldEogToken: true };

// Evaluates `tokens` on `sequence` and takes `n` greedy tokens; returns each token's time.
async function run(sequence, tokens, n) {
  const times = [];
  for await (const _ of sequence.evaluate(tokens, options)) {
    times.push(performance.now());
    if (times.length >= n) break;
  }
  return times;
}

if (mode === "streams") {
  const prompts = Array.from({ length: numStreams }, (_, i) => encode(`${["aa", "ab", "ac", "ad", "ae", "af", "ag", "ah"][i % 8]}${i} ${prompt}`));
  const longest = Math.max(...prompts.map((p) => p.length));
  const context = await model.createContext({ contextSize: numStreams * (longest + numTokens + 1), sequences: numStreams, threads });
  const start = performance.now();
  const runs = await Promise.all(prompts.map((p) => run(context.getSequence(), p, numTokens)));
  const seconds = (performance.now() - start) / 1000;
  const tokens = runs.reduce((sum, times) => sum + times.length, 0);
  console.log(JSON.stringify({ tokens, seconds, tok_s: tokens / seconds }));
} else {
  const tokens = encode(prompt);
  const n = mode === "decode" ? numTokens : 1;
  const context = await model.createContext({ contextSize: tokens.length + n + 1, threads });
  const start = performance.now();
  const times = await run(context.getSequence(), tokens, n);
  if (mode === "first") {
    console.log(JSON.stringify({ prompt_tokens: tokens.length }));
    process.exit(0);
  }
  const ttft = times[0] - start;
  if (mode === "prefill") {
    console.log(JSON.stringify({ prompt_tokens: tokens.length, prefill_ms: ttft }));
  } else {
    const decode = (times.length - 1) / ((times[times.length - 1] - times[0]) / 1000);
    console.log(JSON.stringify({ prompt_tokens: tokens.length, ttft_ms: ttft, decode_tok_s: decode }));
  }
}
process.exit(0);
