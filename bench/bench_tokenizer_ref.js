// bench_tokenizer_ref.js — the reference side of bench_tokenizer.c under node: encode MB/s (one string per
// call, single-threaded, median of runs) for HF tokenizers' node binding (Rust core) and @lenml/tokenizers.
//   npm install --prefix /tmp/tokbench tokenizers@0.23.2 @lenml/tokenizers@3.7.2
//   NODE_PATH=/tmp/tokbench/node_modules node bench/bench_tokenizer_ref.js [DIR] [corpus.jsonl] [MB] [runs]
const fs = require('fs');
const dir = process.argv[2] || '.cache/qwen3-tokenizer';
const corpus = process.argv[3] || 'tests/fixtures/tokenizer/corpus.jsonl';
const mb = Number(process.argv[4] || 4), runs = Number(process.argv[5] || 3);
// a .jsonl file: one JSON string per line, one encode call each; any other file: one call on its whole text
const lines = corpus.endsWith('.jsonl')
  ? fs.readFileSync(corpus, 'utf8').split('\n').filter((l) => l).map((l) => JSON.parse(l))
  : [fs.readFileSync(corpus, 'utf8')];
const bytes = lines.reduce((a, s) => a + Buffer.byteLength(s), 0);
const reps = Math.ceil((mb * 1e6) / bytes);

async function bench(name, encode) {
  const rates = [];
  for (let r = 0; r <= runs; r++) {
    const t0 = process.hrtime.bigint();
    for (let k = 0; k < reps; k++) for (const s of lines) await encode(s);
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    if (r) rates.push((bytes * reps) / dt / 1e6);
  }
  rates.sort((a, b) => a - b);
  console.log(`${name}: ${rates[rates.length >> 1].toFixed(2)} MB/s median (min ${rates[0].toFixed(2)}, max ${rates[rates.length - 1].toFixed(2)})`);
  console.log(`csv,impl=${name},input=${corpus},mb_per_s=${rates[rates.length >> 1].toFixed(2)}`);
}

(async () => {
  console.log(`input: ${corpus}, ${lines.length} strings, ${(bytes / 1e6).toFixed(2)} MB x ${reps} per run`);
  try {
    const { Tokenizer } = require('tokenizers');
    const tok = Tokenizer.fromFile(dir + '/tokenizer.json');
    await bench('hf-tokenizers-node', (s) => tok.encode(s, null, { addSpecialTokens: false }));
  } catch (e) { console.log('hf-tokenizers-node: skipped (' + e.message + ')'); }
  try {
    const { TokenizerLoader } = require('@lenml/tokenizers');
    const tok = TokenizerLoader.fromPreTrained({
      tokenizerJSON: JSON.parse(fs.readFileSync(dir + '/tokenizer.json', 'utf8')),
      tokenizerConfig: JSON.parse(fs.readFileSync(dir + '/tokenizer_config.json', 'utf8')),
    });
    await bench('lenml-tokenizers', (s) => tok.encode(s, { add_special_tokens: false }));
  } catch (e) { console.log('lenml-tokenizers: skipped (' + e.message + ')'); }
})();
