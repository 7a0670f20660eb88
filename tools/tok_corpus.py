#!/usr/bin/env python3
"""tok_corpus.py — builds the tokenizer test corpus (deterministic, seed fixed) and the chat cases.

Writes tests/fixtures/tokenizer/corpus.jsonl (one JSON string per line: many scripts, combining
marks, NFD input, emoji ZWJ/skin tones/flags, code, digit and whitespace runs, CR/LF mixes, mixed-case
contractions, added tokens inside text, random code points, a few very long strings) and
tests/fixtures/tokenizer/chat_cases.jsonl (conversations for the chat-template goldens).
Usage: python3 tools/tok_corpus.py [OUT_DIR]
"""
import json
import os
import random
import sys
import unicodedata

SEED = 20240531
rng = random.Random(SEED)

PHRASES = [
    # Latin scripts
    "The quick brown fox jumps over the lazy dog.", "Hello, world!", "naïve café résumé coöperate",
    "Größenordnung, Straße und Übermaß", "Ça va? Très bien, merci.", "¿Dónde está la biblioteca?",
    "Łódź, Kraków i Gdańsk", "Việt Nam: Tiếng Việt có dấu thanh điệu", "İstanbul'da ışık ve ğ",
    "Dvořák, Škoda, Žižkov", "Ærø, Ødegaard, Åland", "Þórr og Ægir", "Ñandú añejo", "Şişli, Ağrı",
    # Cyrillic, Greek, Armenian, Georgian
    "Привет, мир! Как дела?", "Съешь же ещё этих мягких французских булок", "Ελληνικά: Γειά σου Κόσμε",
    "Ὦ ξεῖν’, ἀγγέλλειν Λακεδαιμονίοις", "Բարեւ աշխարհ", "გამარჯობა მსოფლიო", "Українська мова: ґ, є, ї",
    # Semitic, Indic, SE Asian
    "مرحبا بالعالم", "السَّلَامُ عَلَيْكُمْ وَرَحْمَةُ اللهِ", "اللغة العربية ١٢٣٤٥", "שָׁלוֹם עוֹלָם", "עברית 2024",
    "नमस्ते दुनिया", "हिन्दी में क्षत्रिय और ज्ञान", "संस्कृतम् ॐ", "বাংলা ভাষা", "ਪੰਜਾਬੀ", "ગુજરાતી",
    "தமிழ் மொழி", "తెలుగు భాష", "ಕನ್ನಡ", "മലയാളം", "සිංහල", "ภาษาไทยเป็นภาษาที่ไม่มีช่องว่าง", "ສະບາຍດີ",
    "ភាសាខ្មែរ", "မြန်မာဘာသာ", "བོད་སྐད་", "ᐃᓄᒃᑎᑐᑦ", "ትግርኛ አማርኛ", "ᓀᐦᐃᔭᐍᐏᐣ",
    # CJK
    "你好，世界！", "量子手表每秒滴答。", "我爱北京天安门", "繁體中文與简体中文", "日本語のテキストです。",
    "カタカナとひらがな、漢字", "ｈａｌｆ－ｗｉｄｔｈ ｶﾀｶﾅ", "한국어 텍스트입니다", "안녕하세요 세계",
    "𠀀𠀁𠀂 𪚥 𰻞𰻞麵", "〇一二三四五六七八九十", "「引用」『二重』【括弧】",
    # symbols, math, misc
    "∀x∈ℝ: x² ≥ 0", "E = mc²", "½ ⅓ ¼ ⅛ ⅞", "→ ← ↑ ↓ ⇒ ⇔", "© ® ™ § ¶ † ‡ •", "€ £ ¥ ₹ ₽ ₿ $",
    "“smart quotes” and ‘single’ — dashes – and … ellipsis", "ﬁ ﬂ ﬀ ligatures", "Ⅻ ⅻ Ⅳ", "℃ ℉ K Å",
    "𝐇𝐞𝐥𝐥𝐨 𝕎𝕠𝕣𝕝𝕕", "🄰🄱🄲", "░▒▓█", "♠♣♥♦", "☃☂☀", "⁰¹²³⁴⁵⁶⁷⁸⁹", "₀₁₂₃",
]

EMOJI = [
    "👋", "👋🏻", "👋🏿", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🏴‍☠️", "🇺🇸🇯🇵🇫🇷", "1️⃣2️⃣#️⃣", "❤️", "❤︎", "🕰️",
    "🧑🏾‍🤝‍🧑🏻", "😀😃😄😁", "🤦🏼‍♂️", "👁️‍🗨️", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "✌🏽", "🫠🫶🏻", "🐱‍👤",
]

CODE = [
    "def tick(x: int) -> int:\n    return x + 1\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "for (let i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "<div class=\"x\"><a href='https://example.com/?q=1&r=2'>link</a></div>",
    "#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))\n",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # squares\n",
    "fn main() { let v: Vec<u32> = (0..10).collect(); println!(\"{:?}\", v); }",
    "    if (a && b || !c) {\n        return -1;\n    }\r\n",
    "$ ls -la | grep '^d' > out.txt 2>&1 && echo \"done\"",
    "git commit -m 'fix: off-by-one'\n",
    "a+b == c; // comment?!", "i++; j--; k <<= 2; m >>>= 1;", "@decorator\nclass Foo(Bar):\n\tpass",
    "\\begin{equation} \\int_0^1 x^2 \\, dx = \\frac{1}{3} \\end{equation}",
    "https://www.example.org/path/to/page.html#section-2", "user@example.com", "C:\\Windows\\System32\\",
    "0x7fffffff 0b1010 0o755 1e-9 3.14159 -0.0 1_000_000",
]

CONTRACTIONS = [
    "I'm", "I'M", "you're", "YOU'RE", "You'Re", "we've", "WE'VE", "it's", "IT'S", "It'S", "don't", "DON'T",
    "she'll", "SHE'LL", "He'Ll", "they'd", "THEY'D", "'s", "'S", "'t", "'re", "'ve", "'m", "'ll", "'d",
    "Qwen's", "QWEN'S", "rock'n'roll", "o'clock", "'tis", "y'all'd've", "can’t (curly)", "it\u2019s",
    "'ſ long s", "'K kelvin", "''", "'", "'''s", "' s", "'1", "'é", "L'été", "aujourd'hui",
]

ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
         "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|vision_start|>", "<|image_pad|>",
         "<tool_response>", "</tool_response>", "<|repo_name|>", "<|file_sep|>"]
NEAR_ADDED = ["<|im_start|", "<|im_start", "|im_start|>", "<|IM_START|>", "<| im_start |>", "<<|im_end|>>",
              "<thinking>", "<think >", "</think", "<|endoftext|", "<|im_end|><|im_end|>", "<|<|im_start|>|>"]

SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", "\r\r\n", "\n\r", " \n", "\t\n ", "\u00a0",
          "\u3000", "\u2028", "\u2029", "\u0085", "\u1680", "\u2000", "\u2003", "\u2009", "\u200a", "\u202f",
          "\u205f", "\u180e", "\u200b", "\ufeff", "\u000b", "\u000c", "\u001c", "\u001f"]

COMBINING = [chr(c) for c in list(range(0x300, 0x370)) + [0x483, 0x591, 0x5B0, 0x64B, 0x650, 0x670, 0x93C,
             0x94D, 0x9BC, 0xE31, 0xE48, 0xF71, 0x1AB0, 0x1DC0, 0x20D0, 0x20E3, 0xFE0F, 0xFE0E, 0x3099, 0x309A,
             0x1F3FB, 0xE0100]]

NFD_WORDS = ["café", "Ångström", "naïve", "Việt Nam", "résumé", "한국어", "가각", "ñ", "Å", "é", "ḱṷ", "ἀγάπη",
             "ﬁ", "Ω", "Å", "K", "ǅ", "ẛ̣", "Ṩ", "각", "ᄒᆞ", "가\u11a8", "\u1100\u1161\u11a8"]

SCRIPT_RANGES = [(0x41, 0x7A), (0xC0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x530, 0x58F), (0x5D0, 0x5EA),
                 (0x600, 0x6FF), (0x900, 0x97F), (0x980, 0x9FF), (0xB80, 0xBFF), (0xE00, 0xE7F), (0xE80, 0xEFF),
                 (0xF00, 0xFFF), (0x1000, 0x109F), (0x10A0, 0x10FF), (0x1100, 0x11FF), (0x1780, 0x17FF),
                 (0x1E00, 0x1FFF), (0x2000, 0x2BFF), (0x3040, 0x30FF), (0x3130, 0x318F), (0x4E00, 0x9FFF),
                 (0xAC00, 0xD7A3), (0xF900, 0xFAFF), (0xFB00, 0xFDFF), (0xFE00, 0xFFFD), (0x10000, 0x1FFFF),
                 (0x1F300, 0x1FAFF), (0x20000, 0x2FA1F), (0xE0000, 0xE01EF), (0xF0000, 0xF00FF)]


def rand_char():
    lo, hi = rng.choice(SCRIPT_RANGES)
    while True:
        c = rng.randint(lo, hi)
        if not 0xD800 <= c <= 0xDFFF:
            return chr(c)


def rand_any_char():
    while True:
        c = rng.choice([rng.randint(0, 0x7F), rng.randint(0x80, 0xFFFF), rng.randint(0x10000, 0x10FFFF)])
        if not 0xD800 <= c <= 0xDFFF:
            return chr(c)


def word():
    kind = rng.random()
    if kind < 0.45:
        return rng.choice(rng.choice(PHRASES).split(" ") or ["x"])
    if kind < 0.55:
        return rng.choice(EMOJI)
    if kind < 0.65:
        return rng.choice(CONTRACTIONS)
    if kind < 0.72:
        return str(rng.randint(0, 10 ** rng.randint(1, 12)))
    if kind < 0.80:
        return "".join(rand_char() for _ in range(rng.randint(1, 6)))
    if kind < 0.86:
        return rng.choice("abcdefghijklmnopqrstuvwxyzAEIOU") + "".join(rng.choice(COMBINING) for _ in range(rng.randint(1, 4)))
    if kind < 0.90:
        return rng.choice(ADDED + NEAR_ADDED)
    if kind < 0.95:
        return unicodedata.normalize("NFD", rng.choice(NFD_WORDS + PHRASES[:20]))
    return rng.choice(".,;:!?()[]{}<>\"'`~@#$%^&*-_=+|\\/…—–·")


def sep():
    r = rng.random()
    if r < 0.7:
        return " "
    if r < 0.8:
        return ""
    return rng.choice(SPACES) * rng.randint(1, 3)


def mixed(n_words):
    return "".join(word() + sep() for _ in range(n_words))


def corpus():
    out = []
    out += ["", " ", "a", "\n", "\t", "  ", "hello world", "Hello, world! 你好 123", "1000000",
            "  leading   middle  trailing  ", "literal <|im_start|> marker", "first\nsecond\r\n\nlast",
            " leading\nline\tend ", "café Ångström", unicodedata.normalize("NFD", "café Ångström")]
    out += PHRASES + EMOJI + CODE + CONTRACTIONS + ADDED + NEAR_ADDED
    out += ["x" + s + "y" for s in SPACES] + [s * 5 + "word" + s * 3 for s in SPACES]
    out += [unicodedata.normalize(f, p) for f in ("NFD", "NFKD", "NFKC") for p in PHRASES]
    out += [unicodedata.normalize("NFD", w) for w in NFD_WORDS] + NFD_WORDS
    # combining marks on their own, at the start, stacked (zalgo), after spaces and digits
    out += [m for m in COMBINING] + [" " + m + "x" for m in COMBINING[:40]] + ["1" + m + "2" for m in COMBINING[:20]]
    out += ["Z" + "".join(rng.choice(COMBINING) for _ in range(rng.randint(5, 30))) + "algo" for _ in range(20)]
    # digit runs, number formats
    out += ["".join(rng.choice("0123456789") for _ in range(rng.randint(1, 60))) for _ in range(30)]
    out += ["١٢٣٤٥ ٦٧٨٩", "१२३४५", "๑๒๓", "①②③", "¹²³", "12,345.67", "3.14e-10", "v1.2.3-rc.4", "2024-05-31T12:00:00Z"]
    # whitespace runs and CR/LF mixes
    for _ in range(120):
        out.append("".join(rng.choice(SPACES + ["a", "b", "1", ".", "é", "中"]) for _ in range(rng.randint(1, 40))))
    out += [" " * n + "x" for n in (1, 2, 3, 7, 16, 33)] + ["x" + " " * n for n in (1, 2, 5, 17)]
    out += ["\n" * n + "x" + "\r\n" * n for n in (1, 2, 4, 9)] + ["\t" * n + "code" for n in (1, 2, 4)]
    # added tokens inside text
    for _ in range(150):
        out.append("".join(rng.choice([mixed(rng.randint(0, 4)), rng.choice(ADDED), rng.choice(NEAR_ADDED)])
                           for _ in range(rng.randint(1, 6))))
    out.append("<|im_start|>system\nYou are concise.<|im_end|>\n<|im_start|>user\nSay hello to Firewing.<|im_end|>\n"
               "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # random mixtures
    for _ in range(1100):
        out.append(mixed(rng.randint(1, 25)))
    # random code points (all planes, unassigned and private use included)
    for _ in range(250):
        out.append("".join(rand_any_char() for _ in range(rng.randint(1, 30))))
    for _ in range(150):
        out.append("".join(rand_char() for _ in range(rng.randint(1, 40))))
    # very long strings
    out.append("".join(rng.choice(PHRASES[48:54]) for _ in range(600)))          # CJK without spaces
    out.append(" ".join(rng.choice(PHRASES) for _ in range(1500)))               # mixed prose
    out.append("".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
                       for _ in range(20000)))                                    # base64-like
    out.append(" " * 5000 + "end")
    out.append("\n" * 3000 + "x" + "\t \r\n" * 1000)
    out.append("9" * 4000)
    out.append("".join(rng.choice(EMOJI) for _ in range(1500)))
    out.append("ภาษาไทย" * 1500)
    out.append("".join(rng.choice(CODE) for _ in range(300)))
    out.append("a" * 5000 + "é" * 3000 + "\u0301" * 500)
    out.append(mixed(4000))
    return out


def chat_cases():
    s = "You are concise."
    cases = []

    def add(msgs, gen=True, think=None):
        cases.append({"messages": msgs, "add_generation_prompt": gen, "enable_thinking": think})

    u1 = {"role": "user", "content": "Say hello to Firewing."}
    a1 = {"role": "assistant", "content": "Hello, Firewing!"}
    u2 = {"role": "user", "content": "And now in French?"}
    for think in (None, False, True):
        add([{"role": "system", "content": s}, u1], True, think)
        add([u1], True, think)
        add([u1, a1, u2], True, think)
        add([{"role": "system", "content": s}, u1, a1, u2], True, think)
    add([u1, a1], False)
    add([u1, {"role": "assistant", "content": "<think>\nLet me think.\n</think>\n\nHello!"}], False)
    add([u1, {"role": "assistant", "content": "<think>\nfirst\n</think>\n\nHi"}, u2], True)
    add([u1, {"role": "assistant", "content": "Hi", "reasoning_content": "\nbrief\n"}], False)
    add([u1, {"role": "assistant", "content": "Hi", "reasoning_content": "r1"}, u2,
         {"role": "assistant", "content": "Salut", "reasoning_content": "r2"}], False)
    add([u1, a1, u2, {"role": "assistant", "content": "\n\nSalut"}, {"role": "user", "content": "Merci"}], True, False)
    add([u1, {"role": "assistant", "content": "Let me check."},
         {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "tool", "content": "{\"wind\": 3}"}], True)
    add([u1, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "<tool_response>\nx\n</tool_response>"},
         {"role": "assistant", "content": "done"}], False)
    add([{"role": "system", "content": s}, u1, {"role": "system", "content": "Be brief."}, a1], True)
    add([{"role": "user", "content": "多轮对话：你好 👋 <|im_end|> café\n\nline2"},
         {"role": "assistant", "content": "<think>\n思考\n</think>\n\n你好！"},
         {"role": "user", "content": "Ещё раз, пожалуйста."}], True, False)
    add([{"role": "user", "content": ""}], True)
    add([{"role": "user", "content": "a</think>b"}, {"role": "assistant", "content": "x</think>\n\ny</think>z"}], False)
    return cases


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures",
                                                                    "tokenizer")
    os.makedirs(out_dir, exist_ok=True)
    lines = corpus()
    with open(os.path.join(out_dir, "corpus.jsonl"), "w", encoding="utf-8", newline="\n") as f:
        for s in lines:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
    with open(os.path.join(out_dir, "chat_cases.jsonl"), "w", encoding="utf-8", newline="\n") as f:
        for c in chat_cases():
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    print(f"{len(lines)} strings, {sum(len(s.encode()) for s in lines)} bytes; {len(chat_cases())} chat cases")


if __name__ == "__main__":
    main()
