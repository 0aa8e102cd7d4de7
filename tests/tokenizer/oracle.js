// The tokenizer tests' oracles, under node: npm's gpt-3-encoder (GPT-2's
// encoder, ported) and js-tiktoken (tiktoken's gpt2 and cl100k_base).
//
//   node oracle.js NODE_MODULES encode ENCODER TEXT SEP OUT
//       the documents of TEXT (its parts between SEP) encoded one by one
//       by ENCODER (gpt-3-encoder, gpt2 or cl100k_base), each after the
//       end-of-text id EOT (empty documents left out), into OUT as
//       little-endian uint32: what `dtrain data prepare --doc-separator SEP`
//       must write
//   node oracle.js NODE_MODULES ranks NAME OUT
//       js-tiktoken's ranks of NAME as a tiktoken ranks file (a line per
//       token: its bytes in base64, a space, its rank)
//   node oracle.js NODE_MODULES classes OUT
//       a byte per code point, 0 to U+10FFFF: 1 for \p{L}, 2 for \p{N}, 3
//       for \p{White_Space}, 0 otherwise; 255 for a surrogate or a code point
//       this node's Unicode has not assigned (an older node than the one
//       unicode_gen.js ran under has no opinion on the newer characters)
'use strict';
const fs = require('fs');
const path = require('path');
const [mode, ...args] = process.argv.slice(3);
const modules = path.resolve(process.argv[2]);

function ranksOf(name) {
  return require(path.join(modules, 'js-tiktoken', 'dist', 'ranks', name + '.cjs'));
}

function encoder(name) {
  if (name === 'gpt-3-encoder') {
    return {encode: require(path.join(modules, 'gpt-3-encoder')).encode, eot: 50256};
  }
  const {Tiktoken} = require(path.join(modules, 'js-tiktoken', 'dist', 'lite.cjs'));
  const ranks = ranksOf(name);
  const t = new Tiktoken(ranks);
  return {encode: (s) => t.encode(s), eot: ranks.special_tokens['<|endoftext|>']};
}

if (mode === 'encode') {
  const [name, text, sep, out] = args;
  const {encode, eot} = encoder(name);
  const ids = [];
  for (const doc of fs.readFileSync(text, 'utf8').split(sep)) {
    if (!doc) continue;
    ids.push(eot);
    for (const id of encode(doc)) ids.push(id);
  }
  fs.writeFileSync(out, Buffer.from(new Uint32Array(ids).buffer));
} else if (mode === 'ranks') {
  const [name, out] = args;
  const lines = [];
  for (const l of ranksOf(name).bpe_ranks.split('\n').filter(Boolean)) {
    const [, offset, ...tokens] = l.split(' ');
    tokens.forEach((t, i) => lines.push(t + ' ' + (Number(offset) + i)));
  }
  fs.writeFileSync(out, lines.join('\n') + '\n');
} else if (mode === 'classes') {
  const out = Buffer.alloc(0x110000);
  for (let cp = 0; cp < 0x110000; cp++) {
    const s = String.fromCodePoint(cp);
    out[cp] = /\p{Cs}|\p{Cn}/u.test(s) ? 255 : /\p{L}/u.test(s) ? 1 : /\p{N}/u.test(s) ? 2
            : /\p{White_Space}/u.test(s) ? 3 : 0;
  }
  fs.writeFileSync(args[0], out);
} else {
  console.error('usage: node oracle.js NODE_MODULES encode ENCODER TEXT SEP OUT | ' +
                'ranks NAME OUT | classes OUT');
  process.exit(2);
}
