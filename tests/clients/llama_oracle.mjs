// llama.cpp as an oracle (npm node-llama-cpp 3.21.1, CPU build): greedy tokens of GGUF models.
//
//   node llama_oracle.mjs cases.json
//
// cases.json: [{"model": "a.gguf", "prompt": [token ids] or "text", "n": new tokens, "top": k,
// "kv": "F32" (default), "F16" or "Q8_0": the KV cache's type}, ...]. All cases run in this one process (loading llama.cpp costs more than a small model's
// tokens). Prints one JSON line per case, in order:
//   {"prompt": [the ids evaluated], "tokens": [n greedy ids],
//    "top": [per step: [[id, log p], ...] the k most likely],
//    "eog": the index of the first end-of-generation token in "tokens", -1 if none,
//    "text": llama.cpp's text of the tokens before it}
// Token ids are evaluated as given: no BOS is added. Text is tokenized by llama.cpp, BOS first
// when the vocabulary asks for it. log p is llama.cpp's softmax of the step's raw logits
// (temperature 0 samples greedily and keeps every candidate), so differences of two tokens' log p
// are differences of their logits.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

// node-llama-cpp is an ES module, and an ES import ignores NODE_PATH: find it there by hand.
const home = (process.env.NODE_PATH ?? "").split(":").map((dir) => join(dir, "node-llama-cpp"))
  .find((dir) => existsSync(join(dir, "package.json")));
if (home === undefined) throw new Error("node-llama-cpp is not in NODE_PATH (scripts/npm-deps.sh installs it)");
const { getLlama } = await import(pathToFileURL(join(home, "dist", "index.js")).href);

const cases = JSON.parse(readFileSync(process.argv[2], "utf8"));
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
for (const c of cases) {
  const model = await llama.loadModel({ modelPath: c.model });
  const prompt = typeof c.prompt !== "string" ? c.prompt
    : [...(model.tokens.shouldPrependBosToken ? [model.tokens.bos] : []), ...model.tokenize(c.prompt)];
  // An f32 KV cache and no flash attention by default, as troupe computes: llama.cpp's f16 cache,
  // and its CPU flash attention, round every query, key and value to f16 (F32 logits then differ
  // by 0.04, not 3e-5). A quantized V cache needs flash attention.
  const kv = c.kv ?? "F32";
  const context = await model.createContext({
    contextSize: prompt.length + c.n + 1,
    threads: 1,
    flashAttention: kv === "Q8_0",
    experimentalKvCacheKeyType: kv,
    experimentalKvCacheValueType: kv,
  });
  const sequence = context.getSequence();
  const tokens = [];
  const top = [];
  // EOG tokens are yielded and generation goes on past them, as troupe's transformer does.
  const options = { temperature: 0, yieldEogToken: true };
  for await (const step of sequence.evaluateWithMetadata(prompt, { probabilities: true }, options)) {
    tokens.push(step.token);
    const best = [...step.probabilities.entries()].filter(([, p]) => p > 0).sort((a, b) => b[1] - a[1]).slice(0, c.top ?? 8);
    top.push(best.map(([id, p]) => [id, Math.log(p)]));
    if (tokens.length >= c.n) break;
  }
  const eog = tokens.findIndex((token) => model.isEogToken(token));
  const text = model.detokenize(eog < 0 ? tokens : tokens.slice(0, eog));
  console.log(JSON.stringify({ prompt, tokens, top, eog, text }));
  await context.dispose();
  await model.dispose();
}
await llama.dispose();
