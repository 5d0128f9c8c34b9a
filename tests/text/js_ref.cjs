// The JS reference tokenizers (npm gpt-3-encoder, llama3-tokenizer-js) for tests/text.
//   node js_ref.cjs NPM_PREFIX export-llama3 OUT/tokenizer.json
//       writes Llama 3's vocabulary, merges and special tokens, as the package holds them, in
//       Hugging Face tokenizer.json form (its pattern, ignore_merges as Llama 3 sets it)
//   node js_ref.cjs NPM_PREFIX encode gpt2|llama3 SAMPLES   (one sample a line, hex of UTF-8)
//       prints one line of ids per sample (no BOS/EOS)
//   node js_ref.cjs NPM_PREFIX bench gpt2|llama3 FILE REPS
//       prints bytes=, tokens=, chunks=, seconds=, mb_s= of the best of REPS encodes of FILE
//       in calls of whole lines of up to 4 KiB
'use strict';
const fs = require('fs');
const path = require('path');

const [prefix, cmd, ...rest] = process.argv.slice(2);
const mods = path.resolve(prefix, 'node_modules');

function gpt2() {
  const g = require(path.join(mods, 'gpt-3-encoder'));
  return (s) => g.encode(s);
}

function llama3Tok() {
  return require(path.join(mods, 'llama3-tokenizer-js', 'bundle',
                           'commonjs-llama3-tokenizer-with-baked-data.cjs')).llama3Tokenizer;
}

function llama3() {
  const t = llama3Tok();
  return (s) => t.encode(s, {bos: false, eos: false});
}

function encoder(name) {
  if (name === 'gpt2') return gpt2();
  if (name === 'llama3') return llama3();
  throw new Error('unknown tokenizer ' + name);
}

if (cmd === 'export-llama3') {
  const t = llama3Tok();
  const nSpecial = 256;
  const nVocab = t.vocabById.length - nSpecial;
  const vocab = {};
  for (let i = 0; i < nVocab; i++) vocab[t.vocabById[i]] = i;
  const merges = Array.from(t.merges.entries()).sort((a, b) => a[1] - b[1]).map((e) => e[0]);
  const added = [];
  for (let i = nVocab; i < t.vocabById.length; i++)
    added.push({id: i, content: t.vocabById[i], single_word: false, lstrip: false,
                rstrip: false, normalized: false, special: true});
  const pattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const tj = {
    version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null,
    pre_tokenizer: {type: 'Sequence', pretokenizers: [
      {type: 'Split', pattern: {Regex: pattern}, behavior: 'Isolated', invert: false},
      {type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false}]},
    post_processor: null,
    decoder: {type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true},
    model: {type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
            end_of_word_suffix: null, fuse_unk: false, byte_fallback: false,
            ignore_merges: true, vocab: vocab, merges: merges},
  };
  fs.writeFileSync(rest[0], JSON.stringify(tj));
} else if (cmd === 'encode') {
  const enc = encoder(rest[0]);
  const lines = fs.readFileSync(rest[1], 'utf8').split('\n');
  if (lines[lines.length - 1] === '') lines.pop();
  const out = lines.map((h) => enc(Buffer.from(h, 'hex').toString('utf8')).join(' '));
  process.stdout.write(out.join('\n') + (out.length ? '\n' : ''));
} else if (cmd === 'bench') {
  const enc = encoder(rest[0]);
  const buf = fs.readFileSync(rest[1]);
  // Whole lines of up to 4096 bytes a call, as bench/tokenizer.c cuts them: gpt-3-encoder
  // concatenates its output array once per word, quadratic in one call's token count.
  const chunks = [];
  for (let a = 0; a < buf.length;) {
    let b = a;
    for (;;) {
      const nl = buf.indexOf(10, b);
      const e = nl < 0 ? buf.length : nl + 1;
      if (b > a && e - a > 4096) break;
      b = e;
      if (b === buf.length) break;
    }
    chunks.push(buf.subarray(a, b).toString('utf8'));
    a = b;
  }
  const reps = parseInt(rest[2] || '5', 10);
  let best = 1e30, n = 0;
  for (let r = 0; r < reps; r++) {
    const t0 = process.hrtime.bigint();
    n = 0;
    for (const c of chunks) n += enc(c).length;
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    if (dt < best) best = dt;
  }
  console.log(`bytes=${buf.length} tokens=${n} chunks=${chunks.length} seconds=${best.toFixed(6)} ` +
              `mb_s=${(buf.length / best / 1e6).toFixed(2)}`);
} else {
  console.error('usage: js_ref.cjs NPM_PREFIX (export-llama3 OUT | encode NAME SAMPLES | bench NAME FILE REPS)');
  process.exit(2);
}
