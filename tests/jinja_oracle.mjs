// The chat templates' oracle for tests/jinja_test.cpp: renders a JSON list of
// {template, context} read from stdin with npm @huggingface/jinja (the version
// scripts/npm-deps.sh pins) and prints one JSON list of {ok, output} or {ok: false, error}.
// Usage: node jinja_oracle.mjs NPM_PREFIX YEAR MONTH DAY < cases.json
// strftime_now() reads the clock in @huggingface/jinja: the date given here stands in for
// today, as troupe's renderer is given its date by the caller.
import { createRequire } from "node:module";

const [prefix, year, month, day] = process.argv.slice(2);
const require = createRequire(`${prefix}/node_modules/`);
const { Template } = require("@huggingface/jinja");

const RealDate = Date;
const today = new RealDate(Number(year), Number(month) - 1, Number(day));
globalThis.Date = class extends RealDate {
  constructor(...args) {
    super(...(args.length ? args : [today.getTime()]));
  }
};

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const cases = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const results = cases.map(({ template, context }) => {
  try {
    return { ok: true, output: new Template(template).render(context) };
  } catch (e) {
    return { ok: false, error: String(e && e.message ? e.message : e) };
  }
});
process.stdout.write(JSON.stringify(results));
