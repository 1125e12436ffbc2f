// Renders chat templates with @huggingface/jinja (transformers.js's Jinja), the reference the
// chat-template tests compare pipetrain's renderer with.
//
//   node chat_template.js CASES.json RESULTS.json
//
// CASES.json is a JSON array of cases, each {"template": "...", "context": {...}}; RESULTS.json
// gets a JSON array of results in the same order: {"output": "..."} where the case rendered,
// {"error": "..."} where parsing or rendering threw. (Files, not pipes: the test reads what the
// command printed as its diagnostics.)
const fs = require("fs");
const { Template } = require("@huggingface/jinja");

const [casesPath, resultsPath] = process.argv.slice(2);
const cases = JSON.parse(fs.readFileSync(casesPath, "utf8"));
const results = cases.map(({ template, context }) => {
  try {
    return { output: new Template(template).render(context) };
  } catch (error) {
    return { error: String(error && error.message ? error.message : error) };
  }
});
fs.writeFileSync(resultsPath, JSON.stringify(results));
