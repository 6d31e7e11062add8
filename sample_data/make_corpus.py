"""Procedurally generate the bundled sample corpus (``sample_data/corpus.jsonl``).

The corpus imitates a mixed pre-training corpus: English-like prose drawn from a
handwritten vocabulary with a Zipf-like word distribution, wiki-style articles
with headings, python-ish source files, news-like documents with dates, numbers,
lists and tables, and a few multilingual documents with accented Latin words,
CJK and emoji.  No text is copied from anywhere; everything is produced from the
word lists below and a seeded ``numpy`` random generator, so the output is
byte-for-byte reproducible for a given ``(num_docs, seed)`` (and numpy's PCG64
stream, which has been stable across numpy releases).

Document lengths (in tokens, roughly 4 characters of English each) are lognormal
with a median of about 300 tokens, clipped to [10, 12000]; 0.25% of the
documents are forced to 5000-12000 tokens, and exactly 3 documents are empty.

Usage::

    python sample_data/make_corpus.py                 # writes sample_data/corpus.jsonl
    python sample_data/make_corpus.py --num-docs 40000 --seed 7 --out /tmp/big.jsonl

Library use (e.g. benchmarks)::

    from make_corpus import generate_documents
    docs = generate_documents(40_000, seed=7)   # list of {"id", "text", "source"}
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

DEFAULT_NUM_DOCS = 2500
DEFAULT_SEED = 20240601
DEFAULT_OUT = Path(__file__).resolve().parent / "corpus.jsonl"

NUM_EMPTY_DOCS = 3
LONG_DOC_FRACTION = 0.0025  # share of documents forced to LONG_TOKENS
LONG_TOKENS = (5000.0, 12000.0)
MEDIAN_TOKENS = 300.0
SIGMA = 0.95
MIN_TOKENS, MAX_TOKENS = 10.0, 12000.0

# Handwritten word classes for the prose grammar.  Within a class, words are listed
# roughly by decreasing frequency (rank drives a Zipf weight).
_CLASSES = {
    "D": "the a this that their his her our its every each some no my your one another",
    "A": """old new small large great long little young good high early important public
        different local strong real whole certain clear dark bright heavy warm cold quiet
        loud green blue red white black yellow golden ancient modern narrow wide deep
        shallow weak rich poor busy empty careful sudden gentle proud strange famous
        common rare useful simple short full free open private main final natural late
        tall soft hard fresh quick slow wooden silent distant northern southern tired
        happy curious patient""",
    "N": """time day man woman world house city year way school family group country river
        question book road water room garden station bridge village island forest
        mountain valley coast harbor stone glass window door table paper letter story
        history market office company teacher student child friend doctor farmer king
        queen morning evening night week summer winter storm wind rain sea lake tree
        flower bird horse dog cat song music idea plan problem answer reason result
        system program report price light fire field hill wall street car train ship
        boat map box key bag coat hat meal bread fruit machine engine picture language
        museum library hospital church castle kitchen piece voice journey message
        decision moment""",
    "NS": """people children years days houses books trees students ideas questions letters
        stories friends workers birds horses boats stones windows hours minutes miles
        pages songs""",
    "PN": """London Paris Thomas Mary Robert Anna David Sarah Europe Asia Africa America
        Monday Friday Sunday July March October Berlin Rome Oliver Emma James Lucy Henry
        Clara""",
    "PRO": "he she they we it you I everyone nobody someone",
    "PRS": "he she it someone everyone nobody",
    "DP": "the their these those some many our his her its no my your several",
    "ACMP": """older newer smaller larger greater longer younger better higher earlier
        stronger darker brighter heavier warmer colder quieter louder wider deeper weaker
        richer poorer busier stranger simpler shorter fuller softer harder fresher
        quicker slower taller later""",
    "VBD": """made found saw took gave built wrote read carried brought followed watched
        opened closed left kept held met paid sent described explained measured compared
        repaired answered remembered forgot believed crossed painted cleaned moved used
        needed wanted liked visited reached started finished changed turned pulled pushed
        lost won sold bought showed called asked told heard loved studied planted counted
        lifted shared noticed""",
    "VB": """make find see take give build write read carry bring follow watch open close
        leave keep hold meet pay send describe explain measure compare repair answer
        remember forget cross paint clean move use visit reach start finish change turn
        sell buy show call ask tell hear study share notice""",
    "AUX": "could would should might will must can may didn't couldn't won't can't",
    "P": """of in to for with on at from by about into over after under between through
        during without before across along toward behind beside near around beyond inside
        outside against upon""",
    "ADV": """quickly slowly quietly carefully clearly simply nearly rarely always never
        sometimes usually perhaps soon later once twice again still often suddenly
        finally already together early today easily gently almost really""",
    "SADV": """yesterday today later soon finally meanwhile suddenly however then afterwards
        sometimes eventually still perhaps instead tomorrow""",
    "CONJ": """and but because while although when since until so unless after before
        though whereas if once""",
    "NUM": "two three four five six seven ten twelve twenty several many",
}
# Clause patterns: class names, literal lowercase words, "X?" = optional slot,
# "," = comma after the previous word, "?"/"!" = sentence mood.  Clauses whose
# first slot is CONJ are attached to the previous clause with a comma.
_PATTERNS = (
    (3, "D A? N VBD D A? N"),
    (3, "D A? N VBD D N P D A? N"),
    (3, "PRO VBD D A? N"),
    (3, "PRO VBD D N P D A? N"),
    (2, "PRO AUX VB D A? N"),
    (2, "PRO AUX VB D N P PN"),
    (2, "PN VBD D A? N"),
    (2, "PN VBD P D A? N ADV?"),
    (1, "D N P D N VBD ADV"),
    (1, "D A N VBD P D N"),
    (1, "there was D A? N P D N"),
    (1, "it was D A N"),
    (1, "PRS was A P D N"),
    (2, "D A? N VBZ D A? N"),
    (1, "PN VBZ DP NS P PN"),
    (1, "PRS was VBG D N P D A? N"),
    (1, "DP NS were VBG P D N"),
    (1, "DP A? NS VBD D N"),
    (1, "D N was ACMP than D N"),
    (2, "PN PN VBD D A? N"),
    (1, "PN PN , D A N P PN , VBD DP NS"),
    (1, "D A? N is A"),
    (1, "D N P PN was A"),
    (1, "SADV , PRO VBD D A? N"),
    (1, "P D A? N , D N VBD ADV?"),
    (1, "PRO VBD NUM NS P D N"),
    (1, "NUM NS VBD P D A? N"),
    (1, "PRO ADV VBD D N"),
    (1, "AUX PRO VB D A? N ?"),
    (1, "what did PRO VB P D N ?"),
    (1, "PRO VBD D N !"),
    (2, "CONJ PRO VBD D A? N"),
    (1, "CONJ D N VBD ADV"),
    (1, "CONJ PN AUX VB D N"),
    (1, "CONJ D A? N was A"),
    (1, "CONJ PN PN VBZ P PN"),
)


def _split(text: str) -> list[str]:
    return text.split()


# Syllables for procedurally generated proper names (the long tail of the vocabulary).
_ONSETS = _split("b br c ch d dr f g gr h j k l m n p r s sh st t th tr v w z")
_VOWELS = _split("a e i o u a e i o ai ea ou ie")
_CODAS = ["", "", "", *_split("n r l s th nd rk m st")]
_NAME_ENDS = [""] * 6 + _split("a ia on en ell ford ton by wick ham dale mere stad ov ez ini")
NUM_GENERATED_NAMES = 16000
_UNCOUNTABLE = frozenset(_split("music water bread rain wind history fruit glass paper"))
_FUNCTION_TITLE_WORDS = frozenset(_split("of the a an and in on at to for with by from"))

# Extra words for the multilingual documents (handwritten).
_INTL_WORDS = _split(
    "café naïve résumé façade déjà vu über Zürich München São Paulo señor niño "
    "jalapeño crème brûlée Ångström smörgåsbord Kraków Łódź İstanbul Málaga "
    "Bogotá Reykjavík Québec garçon fiancée piñata Dvořák Köln straße "
    "東京 日本語 中文 你好 世界 学习 数据 データ こんにちは 한국어 北京 大阪 "
    "🙂 🚀 🎉 👍 🌍"
)
_INTL_SENTENCES = (
    "今天天气很好。",
    "我们明天去公园散步吧。",
    "这个数据集很大。",
    "東京は大きい都市です。",
    "ありがとうございます。",
    "서울은 아름다운 도시입니다.",
    "¿Dónde está la estación?",
    "Ça va très bien, merci.",
    "Schöne Grüße aus Köln!",
    "Olá, tudo bem? 🙂",
    "Great job 🎉🎉",
)

# Vocabulary for the python-ish code documents.
_VERBS = _split(
    "get set load save compute parse build update check read write find merge split "
    "create remove apply format filter sort reset init process handle validate "
    "convert collect encode decode flush fetch render"
)
_NOUNS = _split(
    "data value item count total name path size index result buffer config user node "
    "key line token batch record file list table score offset limit cache query state "
    "event message header chunk field entry row column weight step window queue"
)
_CLASS_WORDS = _split(
    "Reader Writer Parser Builder Manager Handler Buffer Cache Index Loader Table "
    "Record Session Client Server Config Report Queue Worker Packer"
)
_MONTHS = _split(
    "January February March April May June July August September October November December"
)


def _plural(w: str) -> str:
    irregular = {"man": "men", "woman": "women", "child": "children"}
    if w in irregular:
        return irregular[w]
    if w.endswith("y") and w[-2] not in "aeiou":
        return w[:-1] + "ies"
    if w.endswith(("s", "x", "ch", "sh")):
        return w + "es"
    return w + "s"


def _third_person(w: str) -> str:
    if w.endswith("y") and w[-2] not in "aeiou":
        return w[:-1] + "ies"
    if w.endswith(("s", "x", "ch", "sh", "o")):
        return w + "es"
    return w + "s"


def _gerund(w: str) -> str:
    if w == "forget":
        return "forgetting"
    if w.endswith("ie"):
        return w[:-2] + "ying"
    if w.endswith("e") and not w.endswith(("ee", "ye", "oe")):
        return w[:-1] + "ing"
    return w + "ing"


def _names(rng: np.random.Generator, n: int, taken: set[str]) -> list[str]:
    """``n`` distinct pronounceable capitalised names made of random syllables."""
    syl = np.array([o + v + c for o in _ONSETS for v in _VOWELS for c in _CODAS], dtype=object)
    syl = np.append(syl, "")  # index len(syl) - 1: no syllable
    ends = np.array(_NAME_ENDS, dtype=object)
    out: dict[str, None] = {}
    while len(out) < n:
        m = n + n // 2
        parts = rng.integers(0, len(syl) - 1, size=(3, m))
        r = rng.random(m)
        nsyl = 1 + (r > 0.45) + (r > 0.9)
        parts[1][nsyl < 2] = len(syl) - 1
        parts[2][nsyl < 3] = len(syl) - 1
        names = syl[parts[0]] + syl[parts[1]] + syl[parts[2]] + ends[rng.integers(0, len(ends), m)]
        for name in names.tolist():
            if 4 <= len(name) <= 14 and name not in taken:
                out[name.capitalize()] = None
                if len(out) == n:
                    break
    return list(out)


# Word endings; a "form" is a word (lower or capitalised) followed by an ending.
# The last three are used for the final word of a chunk (no trailing whitespace).
_ENDS = (" ", ", ", ". ", ".\n\n", "? ", "! ", ".", "?", "!")
E_SPACE, E_COMMA, E_STOP, E_PARA, E_QUEST, E_EXCL, F_STOP, F_QUEST, F_EXCL = range(9)
_NE = len(_ENDS)
_FINAL = [F_STOP] * _NE
_FINAL[E_QUEST], _FINAL[F_QUEST] = F_QUEST, F_QUEST
_FINAL[E_EXCL], _FINAL[F_EXCL] = F_EXCL, F_EXCL

KINDS = ("web", "wiki", "code", "news", "multilingual")
KIND_P = np.array([0.55, 0.15, 0.13, 0.14, 0.03])
# Characters per target token for each kind (calibrated against the bundled
# tokenizer so that realised token counts track the sampled targets).
CHARS_PER_TOKEN = {"web": 4.5, "wiki": 4.4, "code": 3.1, "news": 3.6, "multilingual": 4.4}


class _Uniform:
    """Cheap stream of uniform floats pre-drawn in blocks from a numpy Generator."""

    def __init__(self, rng: np.random.Generator, block: int = 1 << 16) -> None:
        self._rng = rng
        self._block = block
        self._buf: list[float] = []
        self._pos = 0

    def __call__(self) -> float:
        if self._pos >= len(self._buf):
            self._buf = self._rng.random(self._block).tolist()
            self._pos = 0
        u = self._buf[self._pos]
        self._pos += 1
        return u

    def pick(self, seq):
        return seq[int(self() * len(seq))]

    def randint(self, lo: int, hi: int) -> int:
        """Uniform integer in [lo, hi] inclusive."""
        return lo + int(self() * (hi - lo + 1))


class _Grammar:
    """Vocabulary, word classes and expanded clause patterns (built once)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.words: list[str] = []
        self.index: dict[str, int] = {}
        self.class_ids: dict[str, list[int]] = {}
        classes = {name: text.split() for name, text in _CLASSES.items()}
        classes["NS"] += [_plural(w) for w in classes["N"] if w not in _UNCOUNTABLE]
        classes["VBZ"] = [_third_person(w) for w in classes["VB"]]
        classes["VBG"] = [_gerund(w) for w in classes["VB"]]
        taken = {w.lower() for ws in classes.values() for w in ws}
        classes["PN"] += _names(rng, NUM_GENERATED_NAMES, taken)
        for name, ws in classes.items():
            self.class_ids[name] = list(dict.fromkeys(self._wid(w) for w in ws))
        self._wid("an")
        pats = []  # (weight, [(class, forced_comma)], mood)
        for weight, pat in _PATTERNS:
            slots: list[list] = []
            mood = E_STOP
            for t in pat.split():
                if t == ",":
                    slots[-1][2] = True
                elif t in ("?", "!"):
                    mood = E_QUEST if t == "?" else E_EXCL
                else:
                    name = t.rstrip("?")
                    if name not in classes:  # literal word: a singleton class
                        self.class_ids.setdefault("=" + name, [self._wid(name)])
                        name = "=" + name
                    slots.append([name, t.endswith("?"), False])
            n_opt = sum(s[1] for s in slots)
            for mask in range(1 << n_opt):
                kept, j = [], 0
                for name, opt, comma in slots:
                    if opt:
                        j += 1
                        if not mask >> (j - 1) & 1:
                            continue
                    kept.append((name, comma))
                pats.append((weight / (1 << n_opt), kept, mood))
        names = list(self.class_ids)
        cnum = {n: i for i, n in enumerate(names)}
        # Per-class Zipf cdfs concatenated into one array, plus a guide table per class
        # (4 buckets per member) for fast exact vectorised inverse-cdf sampling.
        cdfs, ids, guides, goff, gsize = [], [], [], [], []
        for n in names:
            members = self.class_ids[n]
            wts = 1.0 / (np.arange(len(members)) + 2.7)  # Zipf-Mandelbrot
            cdf = np.cumsum(wts / wts.sum())
            cdf[-1] = 1.0
            t = 4 * len(members)
            guides.append(len(ids) + np.searchsorted(cdf, np.arange(t) / t, side="right"))
            goff.append(sum(gsize))
            gsize.append(t)
            cdfs.append(cdf)
            ids += members
        self.class_cdf = np.concatenate(cdfs)
        self.class_words = np.array(ids, dtype=np.int64)
        self.guide = np.concatenate(guides)
        self.guide_off = np.array(goff, dtype=np.int64)
        self.guide_size = np.array(gsize, dtype=np.int64)
        self.class_cdf_list = {n: cdfs[cnum[n]].tolist() for n in names}
        flat_cls, flat_comma, starts, lens, w, mood, conj = [], [], [], [], [], [], []
        for weight, kept, md in pats:
            starts.append(len(flat_cls))
            lens.append(len(kept))
            flat_cls += [cnum[n] for n, _ in kept]
            flat_comma += [c for _, c in kept]
            w.append(weight)
            mood.append(md)
            conj.append(kept[0][0] == "CONJ")
        self.flat_cls = np.array(flat_cls, dtype=np.int64)
        self.flat_comma = np.array(flat_comma, dtype=bool)
        self.pat_start = np.array(starts, dtype=np.int64)
        self.pat_len = np.array(lens, dtype=np.int64)
        pw = np.array(w) / sum(w)
        self.pat_cdf = np.cumsum(pw)
        self.pat_cdf[-1] = 1.0
        self.mean_clause = float((pw * self.pat_len).sum())
        self.pat_mood = np.array(mood, dtype=np.int64)
        self.pat_conj = np.array(conj, dtype=bool)
        vowel = [x[0] in "aeiou" and not x.startswith("us") for x in self.words]
        self.vowel = np.array(vowel, dtype=bool)
        forms = []
        for x in self.words:
            for cased in (x, x[:1].upper() + x[1:]):
                forms += [cased + e for e in _ENDS]
        self.forms_list = forms
        self.forms = np.array(forms, dtype=object)
        fid = np.arange(len(forms))
        self.cap_of = (((fid // _NE) | 1) * _NE + fid % _NE).tolist()
        self.final_of = ((fid // _NE) * _NE + np.array(_FINAL)[fid % _NE]).tolist()

    def _wid(self, w: str) -> int:
        if w not in self.index:
            self.index[w] = len(self.words)
            self.words.append(w)
        return self.index[w]

    def sample_members(self, cls: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Index into ``class_words`` of a Zipf draw from class ``cls[i]`` given ``u[i]``."""
        k = self.guide_off[cls] + (u * self.guide_size[cls]).astype(np.int64)
        i = self.guide[k]  # first member whose cdf exceeds the bucket start
        todo = np.flatnonzero(self.class_cdf[i] <= u)
        while len(todo):
            i[todo] += 1
            todo = todo[self.class_cdf[i[todo]] <= u[todo]]
        return i

    def sample(self, u: _Uniform, cls: str) -> str:
        cdf = self.class_cdf_list[cls]
        return self.words[self.class_ids[cls][bisect.bisect_right(cdf, u())]]


class _Prose:
    """Vectorised English-like prose: a buffer of word forms, handed out in chunks."""

    def __init__(self, rng: np.random.Generator, u: _Uniform, block: int = 1 << 17) -> None:
        self.g = _Grammar(rng)
        self.rng = rng
        self.u = u
        self.block = block
        self.ids = np.zeros(0, dtype=np.int64)
        self.strs: list[str] = []
        self.ends: list[int] = []
        self._refill(0)
        self.chars_per_word = sum(map(len, self.strs)) / len(self.strs)

    def _refill(self, need: int) -> None:
        g, rng = self.g, self.rng
        m = int(max(self.block, need) / g.mean_clause) + 16
        pid = np.searchsorted(g.pat_cdf, rng.random(m), side="right")
        lens = g.pat_len[pid]
        total = int(lens.sum())
        last = np.cumsum(lens) - 1
        first = last - lens + 1
        slot = np.arange(total) - np.repeat(first, lens) + np.repeat(g.pat_start[pid], lens)
        cls = g.flat_cls[slot]
        w = g.class_words[g.sample_members(cls, rng.random(total))]
        an = (w[:-1] == g.index["a"]) & g.vowel[w[1:]]
        w[:-1][an] = g.index["an"]
        e = np.where(g.flat_comma[slot], E_COMMA, E_SPACE)
        sent_end = ~np.append(g.pat_conj[pid[1:]], False)
        mood = g.pat_mood[pid]
        stop = np.where(rng.random(m) < 0.2, E_PARA, E_STOP)
        e[last] = np.where(sent_end, np.where(mood == E_STOP, stop, mood), E_COMMA)
        cap = np.zeros(total, dtype=np.int64)
        cap[0] = 1
        cap[first[1:][sent_end[:-1]]] = 1
        ext = (w * 2 + cap) * _NE + e
        self.ids = ext
        self.strs = g.forms[ext].tolist()
        self.ends = last[sent_end].tolist()
        self.pos = 0

    def take(self, n: int) -> str:
        """Whole sentences totalling at least ``n`` words (at least one sentence)."""
        n = max(1, int(n))
        k = bisect.bisect_left(self.ends, self.pos + n - 1)
        if k >= len(self.ends):
            self._refill(2 * n + 64)
            k = bisect.bisect_left(self.ends, n - 1)
        a = self.pos
        b = self.ends[k] + 1
        self.pos = b
        parts = self.strs[a:b]
        first = self.g.cap_of[int(self.ids[a])]
        last = int(self.ids[b - 1]) if b - a > 1 else first
        parts[0] = self.g.forms_list[first]
        parts[-1] = self.g.forms_list[self.g.final_of[last]]
        return "".join(parts)

    def take_chars(self, chars: float) -> str:
        return self.take(round(chars / self.chars_per_word))

    def phrase(self, n: int, title: bool = False) -> str:
        """A noun phrase of about ``n`` words; title-cased if ``title``."""
        g, u = self.g, self.u
        n = max(1, int(n))
        ws = [g.sample(u, "A") for _ in range(n - 1)] + [g.sample(u, "N")]
        if n >= 3 and u() < 0.4:
            ws = [ws[0], ws[-1], "of", "the", g.sample(u, "N")]
        if title:
            ws = [x if x in _FUNCTION_TITLE_WORDS else x[:1].upper() + x[1:] for x in ws]
        ws[0] = ws[0][:1].upper() + ws[0][1:]
        return " ".join(ws)


class _Code:
    """Python-ish source files assembled from a per-corpus pool of statements."""

    def __init__(self, u: _Uniform, prose: _Prose, pool_size: int = 3000) -> None:
        self.u = u
        self.prose = prose
        self.funcs = [self._func_name() for _ in range(800)]
        self.vars = [self._var() for _ in range(400)]
        self.stmts = [self._stmt() for _ in range(pool_size)]

    def _var(self) -> str:
        u = self.u
        r = u()
        if r < 0.5:
            return u.pick(_NOUNS)
        if r < 0.9:
            return u.pick(_NOUNS) + "_" + u.pick(_NOUNS)
        return u.pick(_NOUNS) + "_" + str(u.randint(0, 9))

    def _func_name(self) -> str:
        u = self.u
        name = u.pick(_VERBS) + "_" + u.pick(_NOUNS)
        if u() < 0.3:
            name += "_" + u.pick(_NOUNS)
        return "_" + name if u() < 0.1 else name

    def _num(self) -> str:
        u = self.u
        r = u()
        if r < 0.6:
            return str(u.randint(0, 64))
        if r < 0.8:
            return str(1 << u.randint(4, 16))
        return f"{u() * 10:.{u.randint(1, 3)}f}"

    def _stmt(self) -> str:
        """One statement (maybe a small block) at function-body indentation."""
        u = self.u
        v, a, b = u.pick(self.vars), u.pick(self.vars), u.pick(self.vars)
        f, n, x = self._func_name(), self._num(), u.pick("ijkx")
        s = "'" + u.pick(_NOUNS) + "'"
        templates = (
            f"{v} = {f}({a}, {b})",
            f"{v} = {a} + {n}",
            f"{v} = {a} * {b} - {n}",
            f"{v} = [{x} for {x} in {a} if {x} > {n}]",
            f"{v} = {{{s}: {a}, 'size': len({b})}}",
            f"{v}.append({a})",
            f"{v} = {a}.get({s}, {n})",
            f"{v}[{s}] = {b}",
            f"if {a} is None:\n        return {n}",
            f"if len({a}) > {n}:\n        {v} = {a}[:{n}]",
            f"for {x} in range({n}):\n        {v} += {a}[{x}]",
            f"for {x}, {b} in enumerate({a}):\n        {v}[{x}] = {f}({b})",
            f"while {v} < {n}:\n        {v} += 1",
            f"try:\n        {v} = int({a})\n    except ValueError:\n        {v} = 0",
            f'with open({a}, "r", encoding="utf-8") as fh:\n        {v} = fh.read()',
            f"assert len({a}) == {n}, {s}",
            f'logger.debug("{f} %s", {a})',
            f'raise ValueError(f"invalid {v}: {{{v}!r}}")',
            f"{v} = sorted({a}, key=lambda {x}: {x}[{n}])",
            f"{v} = np.zeros(({n}, {a}), dtype=np.int32)",
            f"# {self.prose.take(2 + u.randint(0, 8))}",
        )
        return "    " + u.pick(templates)

    def function(self, method: bool = False) -> str:
        u = self.u
        name = u.pick(self.funcs)
        args = [u.pick(self.vars) for _ in range(u.randint(0, 3))]
        if u() < 0.3 and args:
            args[-1] += "=" + self._num()
        if method:
            args.insert(0, "self")
        lines = [f"def {name}({', '.join(args)}):"]
        if u() < 0.7:
            lines.append(f'    """{self.prose.take(4 + u.randint(0, 10))}"""')
        for _ in range(u.randint(2, 10)):
            lines.append(u.pick(self.stmts))
        lines.append(f"    return {u.pick(self.vars)}")
        return "\n".join(lines) + "\n"

    def file(self, chars: float) -> str:
        u = self.u
        head = ["import os", "import sys"]
        if u() < 0.5:
            head.append("import numpy as np")
        if u() < 0.5:
            head.append("from typing import Any")
        head.append("")
        if u() < 0.5:
            head.append(f"{u.pick(_NOUNS).upper()}_LIMIT = {self._num()}")
        parts = ["\n".join(head) + "\n\n"]
        size = len(parts[0])
        in_class = False
        while size < chars:
            if not in_class and u() < 0.08:
                name = u.pick(_CLASS_WORDS) + u.pick(_CLASS_WORDS)
                doc = self.prose.take(4 + u.randint(0, 8))
                piece = f'class {name}:\n    """{doc}"""\n\n'
                in_class = True
            elif in_class:
                fn = self.function(method=True)
                piece = "    " + fn.replace("\n", "\n    ").rstrip(" ") + "\n"
                if u() < 0.25:
                    in_class = False
                    piece += "\n"
            else:
                piece = self.function() + "\n\n"
            parts.append(piece)
            size += len(piece)
        return "".join(parts).rstrip("\n") + "\n"


class _Builder:
    def __init__(self, seed: int) -> None:
        ss = np.random.SeedSequence(seed)
        r_prose, r_misc = (np.random.default_rng(s) for s in ss.spawn(2))
        self.u = _Uniform(r_misc)
        self.prose = _Prose(r_prose, self.u)
        self.code = _Code(self.u, self.prose)
        self.build: dict[str, Callable[[float], str]] = {
            "web": self.web,
            "wiki": self.wiki,
            "code": self.code.file,
            "news": self.news,
            "multilingual": self.multilingual,
        }

    def web(self, chars: float) -> str:
        return self.prose.take_chars(chars)

    def wiki(self, chars: float) -> str:
        u, p = self.u, self.prose
        title = p.phrase(u.randint(1, 4), title=True)
        parts = [title, p.take_chars(max(chars * 0.3, 60.0))]
        size = sum(map(len, parts))
        while size < chars:
            head = p.phrase(u.randint(1, 3))
            head = f"== {head} ==" if u() < 0.5 else f"## {head}"
            body = p.take_chars(min(chars - size, 400.0 + u() * 2000.0))
            parts += [head, body]
            size += len(head) + len(body)
        return "\n\n".join(parts)

    def _number(self) -> str:
        u = self.u
        r = u()
        if r < 0.3:
            return f"{u.randint(0, 99999):,}"
        if r < 0.5:
            return f"{u() * 100:.{u.randint(1, 2)}f}"
        if r < 0.7:
            return f"{u() * 60 - 20:+.1f}%"
        if r < 0.85:
            return f"${u() * 5000:,.2f}"
        return str(u.randint(1, 500))

    def _date(self) -> str:
        u = self.u
        y, m, d = u.randint(1950, 2024), u.randint(1, 12), u.randint(1, 28)
        r = u()
        if r < 0.4:
            return f"{y:04d}-{m:02d}-{d:02d}"
        if r < 0.8:
            return f"{_MONTHS[m - 1]} {d}, {y}"
        return f"{d:02d}/{m:02d}/{y}"

    def _block(self) -> str:
        u, p = self.u, self.prose
        r = u()
        n = u.randint(3, 12)
        if r < 0.35:
            items = [f"- {p.phrase(u.randint(1, 3))}: {self._number()}" for _ in range(n)]
            return f"{p.phrase(u.randint(1, 3))}:\n" + "\n".join(items)
        if r < 0.55:
            return "\n".join(f"{i + 1}. {p.take(u.randint(3, 12))}" for i in range(n))
        if r < 0.75:
            return "\n".join(f"{self._date()}: {p.take(u.randint(3, 10))}" for _ in range(n))
        cols = [p.phrase(1) for _ in range(u.randint(2, 4))]
        rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for _ in range(n):
            row = [str(u.randint(1990, 2024))] + [self._number() for _ in cols[1:]]
            rows.append("| " + " | ".join(row) + " |")
        return "\n".join(rows)

    def news(self, chars: float) -> str:
        u, p = self.u, self.prose
        parts = [p.phrase(u.randint(3, 8), title=True), f"Published {self._date()}"]
        size = sum(map(len, parts))
        while size < chars:
            piece = (
                self._block() if u() < 0.45 else p.take_chars(min(chars - size, 200 + u() * 800))
            )
            parts.append(piece)
            size += len(piece)
        return "\n\n".join(parts)

    def multilingual(self, chars: float) -> str:
        u = self.u
        paras = self.prose.take_chars(chars * 0.9).split("\n\n")
        out = []
        for para in paras:
            ws = para.split(" ")
            i = u.randint(0, 19)
            while i < len(ws):  # replace ~1 word in 10 (bare words only)
                if ws[i].isalpha():
                    ws[i] = u.pick(_INTL_WORDS)
                i += u.randint(1, 19)
            out.append(" ".join(ws))
            if u() < 0.5:
                out.append(" ".join(u.pick(_INTL_SENTENCES) for _ in range(u.randint(1, 3))))
        return "\n\n".join(out)


def generate_documents(num_docs: int, seed: int) -> list[dict]:
    """Generate ``num_docs`` documents ``{"id", "text", "source"}`` deterministically.

    Exactly ``min(3, num_docs)`` documents have empty text; 0.25% are long
    (5000-12000 tokens); the rest are lognormal around ~300 tokens.
    """
    if num_docs < 0:
        raise ValueError("num_docs must be >= 0")
    rng = np.random.default_rng(seed)
    kinds = np.searchsorted(np.cumsum(KIND_P), rng.random(num_docs) * KIND_P.sum(), side="right")
    kinds = np.minimum(kinds, len(KINDS) - 1)
    tokens = np.exp(rng.normal(math.log(MEDIAN_TOKENS), SIGMA, num_docs))
    tokens = np.clip(tokens, MIN_TOKENS, MAX_TOKENS)
    n_long = round(num_docs * LONG_DOC_FRACTION)
    n_empty = min(NUM_EMPTY_DOCS, num_docs)
    special = rng.permutation(num_docs)[: n_long + n_empty]
    long_idx = special[:n_long]
    empty_idx = set(special[n_long:].tolist())
    lo, hi = (math.log(x) for x in LONG_TOKENS)
    tokens[long_idx] = np.exp(rng.uniform(lo, hi, n_long))
    kinds[tokens < 80] = 0  # tiny documents are plain prose
    builder = _Builder(int(rng.integers(2**63)))
    docs = []
    for i, (k, t) in enumerate(zip(kinds.tolist(), tokens.tolist(), strict=True)):
        kind = KINDS[k]
        text = "" if i in empty_idx else builder.build[kind](t * CHARS_PER_TOKEN[kind])
        docs.append({"id": i, "text": text, "source": kind})
    return docs


def write_jsonl(docs: list[dict], out: Path) -> int:
    """Write ``docs`` as UTF-8 JSON lines; return the number of bytes written."""
    data = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode("utf-8")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    return len(data)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--num-docs", type=int, default=DEFAULT_NUM_DOCS)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    docs = generate_documents(args.num_docs, args.seed)
    t1 = time.perf_counter()
    nbytes = write_jsonl(docs, args.out)
    t2 = time.perf_counter()
    text_mb = sum(len(d["text"].encode("utf-8")) for d in docs) / 1e6
    print(
        f"wrote {len(docs)} docs, {nbytes} bytes to {args.out} "
        f"(generate {t1 - t0:.2f}s = {text_mb / max(t1 - t0, 1e-9):.1f} MB/s, "
        f"write {t2 - t1:.2f}s)"
    )


if __name__ == "__main__":
    main()
