"""A deterministic corpus of strings that exercises every rule of the Spark
pre-tokenizer (SPEC §5): English, code, CJK, kana, Arabic, Hindi, emoji and
ZWJ sequences, digit runs of every numeric class, mixed whitespace and
newlines, every punctuation / symbol class, and added-token text embedded in
sentences (whole, cut, and doubled).

make_corpus(n, seed, added) returns n strings; the same seed always gives the
same list, so a failure names a reproducible string.
"""
import random
import unicodedata

WORDS = ("the of and to in is was that for on with as by at from his her they "
         "capital France Paris tokenizer model runtime inference Spark language "
         "don't it's we're I'll you've can't O'Neil rock'n'roll e-mail self-test "
         "naïve café résumé Zürich Ærø Øresund façade coöperate İstanbul ǅemal "
         "HTTP JSON UTF-8 x86_64 GPT-2 iPhone McDonald's").split()

CODE = [
    "def f(x):\n    return x**2 + 1\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n}\n",
    "const x = arr.map((v) => v?.y ?? 0).filter(Boolean);",
    "if a != b and not c: raise ValueError(f\"bad {a!r}\")",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "    # comment with trailing spaces   \n\n\n    pass",
    "x<<=2; y>>=3; z^=~w; p->q = &r; s::t<u>::v;",
    "$HOME/.config/app.json && echo $? || exit 1",
    "<div class=\"a\">&amp;&lt;</div><!-- c -->",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "a_b_c __init__ __dunder__ _x0 camelCase snake_case SCREAMING_CASE",
    "matrix[0][1] = {'k': [1, 2.5e-3, -7], \"v\": null}",
    "@decorator\nclass A(B, metaclass=M):\n\t'''doc'''\r\n",
]

RANGES = {
    "cjk": [(0x4E00, 0x9FA5)],
    "cjk_ext": [(0x3400, 0x4DB5), (0x9FA6, 0x9FEF), (0xF900, 0xFA2D), (0x20000, 0x2A6D6)],
    "hiragana": [(0x3041, 0x309F)],
    "katakana": [(0x30A0, 0x30FF), (0x31F0, 0x31FF), (0xFF66, 0xFF9D)],
    "hangul": [(0xAC00, 0xD7A3), (0x1100, 0x11FF)],
    "arabic": [(0x0621, 0x064A), (0x064B, 0x0652), (0x0660, 0x0669), (0x066A, 0x066D), (0x06F0, 0x06F9)],
    "hindi": [(0x0900, 0x0939), (0x093A, 0x094F), (0x0950, 0x0963), (0x0964, 0x096F)],
    "thai": [(0x0E01, 0x0E3A), (0x0E40, 0x0E5B)],
    "cyrillic": [(0x0410, 0x044F), (0x0400, 0x040F)],
    "greek": [(0x0391, 0x03A9), (0x03B1, 0x03C9), (0x1F00, 0x1F15)],
    "hebrew": [(0x05D0, 0x05EA), (0x0591, 0x05C7)],
}

CJK_PUNCT = "，。、！？；：「」『』（）【】《》〈〉…—～·〜￥％＃＠＆＊＋－＝／＼｜"
FULLWIDTH = "ＡＢＣａｂｃ０１２３４５６７８９"

EMOJI = [
    "😀", "🎉", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🏴‍☠️", "🇫🇷", "🇯🇵🇨🇳", "❤️", "✨", "🤖",
    "1️⃣", "#️⃣", "*️⃣", "👩🏿‍🚀", "🧑‍💻", "🐈‍⬛", "☺", "✌️", "™", "©", "®", "🔥🔥🔥",
    "\u200d", "\ufe0f", "👁‍🗨", "🫠", "🪿",
]

WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", "   \n", "\u00a0", "\u3000", "\u2028",
              "\u2029", "\u2003", "\u202f", "\u205f", "\u1680", "\u0085", "\x0b", "\x0c",
              "\u200b", "\ufeff", " \t \n ", "\n \n", "    ", "\t\t"]

NUMERIC = ["0", "7", "42", "123", "1234", "31415926535", "1,000,000", "3.14", "-2e10", "007",
           "２０２４", "٣٤٥", "१२३", "²³", "½", "¾", "Ⅻ", "ⅷ", "①②", "⑩", "〇", "𝟘𝟙", "١٢", "໑",
           "12:30", "v1.2.3", "0x1F", "1st", "2nd", "50%", "$100", "€5,50", "#1"]


def punct_symbols():
    """Characters of every punctuation and symbol class (BMP, assigned in
    Unicode 13, so the regex engines under test agree on them)."""
    cats = {}
    for cp in range(0x20, 0x3000):
        ch = chr(cp)
        cat = unicodedata.category(ch)
        if cat[0] in "PS":
            cats.setdefault(cat, []).append(ch)
    return cats


def rand_range(rng, name, k):
    out = []
    for _ in range(k):
        lo, hi = rng.choice(RANGES[name])
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


class Gen:
    def __init__(self, seed, added):
        self.rng = random.Random(seed)
        self.added = list(added)
        self.ps = punct_symbols()
        self.ps_all = sorted(c for v in self.ps.values() for c in v)

    def english(self):
        r = self.rng
        words = [r.choice(WORDS) for _ in range(r.randint(1, 14))]
        if r.random() < 0.5:
            words[0] = words[0].capitalize()
        s = " ".join(words)
        if r.random() < 0.3:
            s = s.upper() if r.random() < 0.5 else s.title()
        return s + r.choice(["", ".", "!", "?", "...", ",", ";", ":", " ", "\n", "?!", "—"])

    def code(self):
        r = self.rng
        s = r.choice(CODE)
        if r.random() < 0.5:
            s = s.replace("    ", r.choice(["  ", "\t", "        "]))
        return s if r.random() < 0.7 else s + r.choice(CODE)

    def script(self, name):
        r = self.rng
        parts = []
        for _ in range(r.randint(1, 6)):
            parts.append(rand_range(r, name, r.randint(1, 8)))
            parts.append(r.choice([" ", "", ",", "。", "、", "\n", " ", "ー", "・", "؟", "।", "!"]))
        return "".join(parts)

    def cjk(self):
        r = self.rng
        s = []
        for _ in range(r.randint(1, 8)):
            k = r.random()
            if k < 0.5:
                s.append(rand_range(r, "cjk", r.randint(1, 6)))
            elif k < 0.6:
                s.append(rand_range(r, "cjk_ext", r.randint(1, 3)))
            elif k < 0.75:
                s.append(r.choice(CJK_PUNCT))
            elif k < 0.85:
                s.append(r.choice(WORDS))
            elif k < 0.92:
                s.append(r.choice(NUMERIC))
            else:
                s.append(r.choice(FULLWIDTH))
        return "".join(s)

    def kana(self):
        r = self.rng
        s = [rand_range(r, r.choice(["hiragana", "katakana"]), r.randint(1, 6)) for _ in range(r.randint(1, 5))]
        glue = r.choice(["", "ー", "・", "゛", "\u3099", "々", "漢字", " ", "、"])
        return glue.join(s)

    def emoji(self):
        r = self.rng
        return "".join(r.choice(EMOJI + [" ", "", "a", "1", "！"]) for _ in range(r.randint(1, 8)))

    def digits(self):
        r = self.rng
        if r.random() < 0.4:
            return "".join(r.choice("0123456789") for _ in range(r.randint(1, 40)))
        return r.choice(["", " "]).join(r.choice(NUMERIC + WORDS[:5]) for _ in range(r.randint(1, 6)))

    def whitespace(self):
        r = self.rng
        parts = []
        for _ in range(r.randint(1, 8)):
            parts.append(r.choice(WHITESPACE))
            if r.random() < 0.6:
                parts.append(r.choice(WORDS + ["中文", "!", "123", "...", "x"]))
        return "".join(parts)

    def punct(self):
        r = self.rng
        if r.random() < 0.5:  # one class at a time, next to letters
            cat = r.choice(sorted(self.ps))
            chars = "".join(r.choice(self.ps[cat]) for _ in range(r.randint(1, 4)))
            return r.choice(["", " ", "a", "A"]) + chars + r.choice(["", "b", "Bc", " d", "1", "中"])
        return "".join(r.choice(self.ps_all + list(" abcXYZ")) for _ in range(r.randint(1, 16)))

    def special(self):
        r = self.rng
        tok = r.choice(self.added) if self.added else "<|User|>"
        k = r.random()
        if k < 0.15:
            tok = tok[: r.randint(1, max(1, len(tok) - 1))]  # a cut token is plain text
        elif k < 0.25:
            tok = tok + tok
        elif k < 0.3:
            tok = tok[:1] + tok  # "<" + "<think>"
        return self.english() + r.choice(["", " ", "\n"]) + tok + r.choice(["", " ", "\n"]) + self.english()

    def random_unicode(self):
        r = self.rng
        out = []
        for _ in range(r.randint(1, 12)):
            cp = r.randint(0x20, 0x2FFFF)
            if 0xD800 <= cp <= 0xDFFF:
                continue
            ch = chr(cp)
            if unicodedata.category(ch) in ("Cn", "Co", "Cs"):
                continue
            out.append(ch)
        return "".join(out) or "x"

    def mixed(self):
        r = self.rng
        kinds = [self.english, self.code, self.cjk, self.kana, self.emoji, self.digits, self.whitespace,
                 self.punct, lambda: self.script(r.choice(sorted(RANGES)))]
        return r.choice(["", " ", "\n"]).join(r.choice(kinds)() for _ in range(r.randint(2, 4)))


def make_corpus(n=12000, seed=1234, added=()):
    g = Gen(seed, added)
    r = g.rng
    kinds = [
        ("english", g.english), ("code", g.code), ("cjk", g.cjk), ("kana", g.kana),
        ("arabic", lambda: g.script("arabic")), ("hindi", lambda: g.script("hindi")),
        ("other_scripts", lambda: g.script(r.choice(["thai", "cyrillic", "greek", "hebrew", "hangul"]))),
        ("emoji", g.emoji), ("digits", g.digits), ("whitespace", g.whitespace), ("punct", g.punct),
        ("special", g.special), ("random_unicode", g.random_unicode), ("mixed", g.mixed),
    ]
    out = []
    for i in range(n):
        name, fn = kinds[i % len(kinds)]
        out.append(fn())
    # A few fixed edge cases.
    out += ["", " ", "\n", "  \n  ", "a", "中", "1", "The capital of France is", " Paris",
            "x" * 5000, " " * 300, "\n" * 50, "中" * 2000, "😀" * 500, "1" * 1000,
            "\u0006", "a\u0006b", "\x00", "tab\there", "<｜end▁of▁sentence｜>"]
    return out
