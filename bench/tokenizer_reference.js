// Hugging Face's tokenizers (the Rust library, through @anush008/tokenizers from
// tests/reference) on the documents tokenizer_bench reads: encode one document at a time, and
// encodeBatch over all of them (Rust's own threads; RAYON_NUM_THREADS=1 for one).
//   node bench/tokenizer_reference.js TOKENIZER_JSON FILE... [--document-bytes N]
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require(path.join(__dirname, '..', 'tests', 'reference', 'node_modules',
                                        '@anush008', 'tokenizers'));

function documentsOf(text, bytes) {
  // As tokenizer_bench cuts them: about `bytes` bytes, at line ends.
  const buffer = Buffer.from(text, 'utf8');
  const documents = [];
  let begin = 0;
  while (begin < buffer.length) {
    let end = buffer.indexOf(10, Math.min(buffer.length, begin + bytes));
    end = end < 0 ? buffer.length : end + 1;
    documents.push(buffer.subarray(begin, end).toString('utf8'));
    begin = end;
  }
  return documents;
}

(async () => {
  const args = process.argv.slice(2);
  let documentBytes = 4096;
  const files = [];
  for (let i = 1; i < args.length; ++i) {
    if (args[i] === '--document-bytes') documentBytes = Number(args[++i]);
    else files.push(args[i]);
  }
  const text = files.map((f) => fs.readFileSync(f, 'utf8')).join('');
  const megabytes = Buffer.byteLength(text, 'utf8') / 1e6;
  const tokenizer = Tokenizer.fromFile(args[0]);
  const documents = documentsOf(text, documentBytes);
  const best = async (fn) => {
    let best = Infinity;
    for (let r = 0; r < 3; ++r) {
      const start = process.hrtime.bigint();
      await fn();
      best = Math.min(best, Number(process.hrtime.bigint() - start) / 1e9);
    }
    return best;
  };
  let tokens = 0;
  const one = await best(async () => {
    tokens = 0;
    for (const d of documents) tokens += (await tokenizer.encode(d, null, { addSpecialTokens: false })).getIds().length;
  });
  const batch = await best(async () => { await tokenizer.encodeBatch(documents, { addSpecialTokens: false }); });
  console.log(`${args[0]}: ${megabytes.toFixed(2)} MB, ${documents.length} documents, ${tokens} tokens`);
  console.log(`encode, one document at a time: ${(megabytes / one).toFixed(2)} MB/s`);
  console.log(`encodeBatch:                    ${(megabytes / batch).toFixed(2)} MB/s`);
})().catch((error) => { console.error(error); process.exit(1); });
