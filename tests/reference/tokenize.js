// The reference for pipetrain's Tokenizer: Hugging Face's tokenizers (the Rust library, through
// @anush008/tokenizers) on the same tokenizer.json and texts.
//   node tokenize.js TOKENIZER_JSON TEXTS_JSON OUT_JSON
// TEXTS_JSON holds a list of strings; OUT_JSON gets, for each text, its ids with and without
// special tokens and the text decode() gives back from the former.
const fs = require('fs');
const { Tokenizer } = require('@anush008/tokenizers');

(async () => {
  const [tokenizerFile, textsFile, outFile] = process.argv.slice(2);
  const tokenizer = Tokenizer.fromFile(tokenizerFile);
  const texts = JSON.parse(fs.readFileSync(textsFile, 'utf8'));
  const results = [];
  for (const text of texts) {
    const withSpecial = (await tokenizer.encode(text, null, { addSpecialTokens: true })).getIds();
    const plain = (await tokenizer.encode(text, null, { addSpecialTokens: false })).getIds();
    const decoded = await tokenizer.decode(withSpecial, false);
    const decodedSkipping = await tokenizer.decode(withSpecial, true);
    results.push({ ids: Array.from(withSpecial), plain: Array.from(plain), decoded,
                   decoded_skipping_special: decodedSkipping });
  }
  fs.writeFileSync(outFile, JSON.stringify(results));
})().catch((error) => { console.error(error); process.exit(1); });
