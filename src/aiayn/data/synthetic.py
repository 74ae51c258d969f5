"""A toy English -> German translation task, generated from a small grammar (no download).

The offline demo needs a translation task that a small Transformer learns in minutes on a CPU yet
still shows what makes translation hard: the target is *not* a word-by-word copy of the source.
Every sentence is drawn as a syntax tree and rendered twice, once in English and once in German,
so the German side is a deterministic function of the English side (:func:`translate` parses the
English back and re-renders it, and the tests hold the two equal on every generated pair).

What the grammar shows:

* **Word order.** German main clauses are verb-second (V2): a fronted adverb or subordinate clause
  pushes the subject behind the verb ("today the dog sleeps" -> "heute schläft der Hund").
  Subordinate clauses are verb-final ("because the dog sees the ball" -> "weil der Hund den Ball
  sieht"). Separable verbs split in main clauses and rejoin in subordinate ones ("the dog picks up
  the ball" -> "der Hund hebt den Ball auf"; "..., weil der Hund den Ball aufhebt").
* **Gender and case.** der/die/das by gender; accusative objects (den Hund); dative after "with",
  "behind", ... and for the verbs helfen/folgen (mit dem Hund, der Hund hilft der Katze), with the
  dative plural -n (mit den Hunden) and the contraction in + dem -> im; ein/eine/einen/einem/einer;
  adjective endings (weak after der, mixed after ein, strong without article); relative pronouns
  der/die/das/den/dem/denen.
* **A long-range dependency.** A relative clause sits between the subject and its verb, which must
  agree in number with the subject several words back ("the dogs that see the cat run" -> "die
  Hunde , die die Katze sehen , laufen").

English is lower-case; German capitalises its nouns as usual. Punctuation (only commas) is a
separate token on both sides, and sentences carry no final full stop.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from aiayn.errors import AiaynError

# --------------------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------------------

NOM, ACC, DAT = "nom", "acc", "dat"


@dataclass(frozen=True)
class Noun:
    """A noun with its English and German forms.

    Args:
        en: English singular.
        en_pl: English plural.
        de: German singular (the same form in every case: no weak masculine nouns here).
        de_pl: German plural nominative/accusative; the dative plural adds -n unless it ends in n or s.
        gender: "m", "f" or "n".
        kind: "animate" (may be a subject), "portable" (may be carried) or "place".
    """

    en: str
    en_pl: str
    de: str
    de_pl: str
    gender: str
    kind: str

    def german(self, plural: bool, case: str) -> str:
        """The German form in the given number and case."""
        if not plural:
            return self.de
        if case == DAT and not self.de_pl.endswith(("n", "s")):
            return self.de_pl + "n"
        return self.de_pl


@dataclass(frozen=True)
class Verb:
    """A verb with its 3rd-person present forms.

    Args:
        en: English 3rd-person singular, possibly two words ("picks up").
        en_pl: English plural ("pick up").
        de: German 3rd-person singular finite stem without the separable prefix ("hebt").
        de_pl: German plural without the prefix ("heben").
        kind: "trans", "intrans" or "clausal" (takes a that-clause).
        prefix: German separable prefix ("auf"), "" if none.
        case: the case of the object ("acc", or "dat" for helfen/folgen).
        objects: noun kinds allowed as object when generating (the parser accepts any).
    """

    en: str
    en_pl: str
    de: str
    de_pl: str
    kind: str
    prefix: str = ""
    case: str = ACC
    objects: tuple[str, ...] = ("animate", "portable", "place")

    def finite(self, plural: bool) -> str:
        """The main-clause finite form (the prefix goes to the clause end)."""
        return self.de_pl if plural else self.de

    def final(self, plural: bool) -> str:
        """The subordinate-clause form, with the prefix joined on ("aufhebt")."""
        return self.prefix + self.finite(plural)


@dataclass(frozen=True)
class Prep:
    """A preposition with the case it governs and the noun kinds it takes when generating."""

    en: str
    de: str
    case: str
    objects: tuple[str, ...]


@dataclass(frozen=True)
class Adj:
    """An adjective: English form, German stem (the ending is added by declension), and the noun
    kinds it describes when generating (the parser accepts any)."""

    en: str
    de: str
    nouns: tuple[str, ...] = ("animate", "portable", "place")


NOUNS: tuple[Noun, ...] = (
    Noun("dog", "dogs", "Hund", "Hunde", "m", "animate"),
    Noun("cat", "cats", "Katze", "Katzen", "f", "animate"),
    Noun("child", "children", "Kind", "Kinder", "n", "animate"),
    Noun("girl", "girls", "Mädchen", "Mädchen", "n", "animate"),
    Noun("man", "men", "Mann", "Männer", "m", "animate"),
    Noun("woman", "women", "Frau", "Frauen", "f", "animate"),
    Noun("bird", "birds", "Vogel", "Vögel", "m", "animate"),
    Noun("horse", "horses", "Pferd", "Pferde", "n", "animate"),
    Noun("teacher", "teachers", "Lehrer", "Lehrer", "m", "animate"),
    Noun("mouse", "mice", "Maus", "Mäuse", "f", "animate"),
    Noun("friend", "friends", "Freund", "Freunde", "m", "animate"),
    Noun("ball", "balls", "Ball", "Bälle", "m", "portable"),
    Noun("book", "books", "Buch", "Bücher", "n", "portable"),
    Noun("apple", "apples", "Apfel", "Äpfel", "m", "portable"),
    Noun("flower", "flowers", "Blume", "Blumen", "f", "portable"),
    Noun("bag", "bags", "Tasche", "Taschen", "f", "portable"),
    Noun("chair", "chairs", "Stuhl", "Stühle", "m", "portable"),
    Noun("house", "houses", "Haus", "Häuser", "n", "place"),
    Noun("garden", "gardens", "Garten", "Gärten", "m", "place"),
    Noun("car", "cars", "Auto", "Autos", "n", "place"),
    Noun("tree", "trees", "Baum", "Bäume", "m", "place"),
    Noun("table", "tables", "Tisch", "Tische", "m", "place"),
    Noun("door", "doors", "Tür", "Türen", "f", "place"),
)

_ANIMATE = ("animate",)
_THINGS = ("portable",)
VERBS: tuple[Verb, ...] = (
    Verb("sees", "see", "sieht", "sehen", "trans"),
    Verb("finds", "find", "findet", "finden", "trans"),
    Verb("likes", "like", "mag", "mögen", "trans"),
    Verb("looks at", "look at", "schaut", "schauen", "trans", prefix="an"),
    Verb("holds", "hold", "hält", "halten", "trans", objects=_THINGS),
    Verb("carries", "carry", "trägt", "tragen", "trans", objects=_THINGS),
    Verb("picks up", "pick up", "hebt", "heben", "trans", prefix="auf", objects=_THINGS),
    Verb("calls", "call", "ruft", "rufen", "trans", prefix="an", objects=_ANIMATE),
    Verb("helps", "help", "hilft", "helfen", "trans", case=DAT, objects=_ANIMATE),
    Verb("follows", "follow", "folgt", "folgen", "trans", case=DAT, objects=_ANIMATE),
    Verb("runs", "run", "läuft", "laufen", "intrans"),
    Verb("sleeps", "sleep", "schläft", "schlafen", "intrans"),
    Verb("plays", "play", "spielt", "spielen", "intrans"),
    Verb("sings", "sing", "singt", "singen", "intrans"),
    Verb("waits", "wait", "wartet", "warten", "intrans"),
    Verb("wakes up", "wake up", "wacht", "wachen", "intrans", prefix="auf"),
    Verb("says", "say", "sagt", "sagen", "clausal"),
    Verb("believes", "believe", "glaubt", "glauben", "clausal"),
    Verb("hopes", "hope", "hofft", "hoffen", "clausal"),
)

_ALL = ("animate", "portable", "place")
_LOCATIONS = ("place",)
PREPS: tuple[Prep, ...] = (
    Prep("with", "mit", DAT, _ALL),
    Prep("without", "ohne", ACC, _ALL),
    Prep("in", "in", DAT, _LOCATIONS),
    Prep("behind", "hinter", DAT, _LOCATIONS),
    Prep("under", "unter", DAT, _LOCATIONS),
    Prep("next to", "neben", DAT, _LOCATIONS),
)

ADJS: tuple[Adj, ...] = (
    Adj("big", "groß"),
    Adj("small", "klein"),
    Adj("old", "alt"),
    Adj("young", "jung", ("animate",)),
    Adj("red", "rot", ("portable", "place")),
    Adj("fast", "schnell", ("animate",)),
)

ADVERBS: dict[str, str] = {"today": "heute", "now": "jetzt", "sometimes": "manchmal"}
CONJUNCTIONS: dict[str, str] = {"because": "weil", "when": "wenn"}
COMPLEMENTIZER = ("that", "dass")

DEFINITE = {  # (gender or "pl", case) -> article
    **{("m", c): a for c, a in ((NOM, "der"), (ACC, "den"), (DAT, "dem"))},
    **{("f", c): a for c, a in ((NOM, "die"), (ACC, "die"), (DAT, "der"))},
    **{("n", c): a for c, a in ((NOM, "das"), (ACC, "das"), (DAT, "dem"))},
    **{("pl", c): a for c, a in ((NOM, "die"), (ACC, "die"), (DAT, "den"))},
}
INDEFINITE = {
    **{("m", c): a for c, a in ((NOM, "ein"), (ACC, "einen"), (DAT, "einem"))},
    **{("f", c): a for c, a in ((NOM, "eine"), (ACC, "eine"), (DAT, "einer"))},
    **{("n", c): a for c, a in ((NOM, "ein"), (ACC, "ein"), (DAT, "einem"))},
}
RELATIVE = {**DEFINITE, ("pl", DAT): "denen"}
# Adjective endings: weak after der/die/das, mixed after ein, strong with no article (plural only).
WEAK = {key: "en" for key in DEFINITE} | {
    ("m", NOM): "e",
    ("f", NOM): "e",
    ("n", NOM): "e",
    ("f", ACC): "e",
    ("n", ACC): "e",
}
MIXED = {key: "en" for key in INDEFINITE} | {
    ("m", NOM): "er",
    ("f", NOM): "e",
    ("n", NOM): "es",
    ("f", ACC): "e",
    ("n", ACC): "es",
}
STRONG_PLURAL = {NOM: "e", ACC: "e", DAT: "en"}
CONTRACTIONS = {("in", "dem"): "im"}


# --------------------------------------------------------------------------------------------------
# Syntax trees
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NP:
    """A noun phrase: determiner ("the", "a" or "" for a bare plural), optional adjective, noun,
    and optionally a relative clause (subjects only)."""

    noun: Noun
    plural: bool
    det: str
    adj: Adj | None = None
    rel: Rel | None = None


@dataclass(frozen=True)
class PP:
    """A prepositional phrase (always an adjunct of the verb, at the end of its clause)."""

    prep: Prep
    np: NP


@dataclass(frozen=True)
class Rel:
    """A relative clause on a noun. With ``subj`` None it is a subject relative ("that sees the
    cat"); otherwise an object relative whose gap is the object ("that the cat sees")."""

    verb: Verb
    obj: NP | None = None
    subj: NP | None = None
    pp: PP | None = None


@dataclass(frozen=True)
class Clause:
    """Subject, verb, and the verb's object, prepositional adjunct or that-clause."""

    subj: NP
    verb: Verb
    obj: NP | None = None
    pp: PP | None = None
    comp: Clause | None = None


@dataclass(frozen=True)
class Sentence:
    """A main clause, optionally with a fronted adverb, or a subordinate clause that is fronted
    ("because ..., the cat sleeps") or trailing ("the cat sleeps because ...")."""

    main: Clause
    adverb: str | None = None
    conj: str | None = None
    sub: Clause | None = None
    fronted: bool = False


# --------------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------------


def _np_en(np: NP) -> list[str]:
    words = ([np.adj.en] if np.adj else []) + [np.noun.en_pl if np.plural else np.noun.en]
    if np.det == "a":
        det = ["an" if words[0][0] in "aeiou" else "a"]
    else:
        det = [np.det] if np.det else []
    out = det + words
    if np.rel is not None:
        r = np.rel
        out.append("that")
        if r.subj is None:
            out += r.verb.en_pl.split() if np.plural else r.verb.en.split()
            out += _np_en(r.obj) if r.obj else []
        else:
            out += _np_en(r.subj) + (r.verb.en_pl if r.subj.plural else r.verb.en).split()
        out += _pp_en(r.pp)
    return out


def _pp_en(pp: PP | None) -> list[str]:
    return [] if pp is None else pp.prep.en.split() + _np_en(pp.np)


def _clause_en(c: Clause) -> list[str]:
    out = _np_en(c.subj) + (c.verb.en_pl if c.subj.plural else c.verb.en).split()
    out += _np_en(c.obj) if c.obj else []
    out += _pp_en(c.pp)
    if c.comp is not None:
        out += [COMPLEMENTIZER[0]] + _clause_en(c.comp)
    return out


def render_english(s: Sentence) -> str:
    """The English sentence of a tree, as space-separated lower-case tokens."""
    if s.fronted:
        assert s.conj is not None and s.sub is not None
        return " ".join([s.conj, *_clause_en(s.sub), ",", *_clause_en(s.main)])
    out = ([s.adverb] if s.adverb else []) + _clause_en(s.main)
    if s.sub is not None:
        assert s.conj is not None
        out += [s.conj] + _clause_en(s.sub)
    return " ".join(out)


def _np_de(np: NP, case: str) -> list[str]:
    g = "pl" if np.plural else np.noun.gender
    if np.det == "the":
        art, endings = [DEFINITE[g, case]], WEAK
    elif np.det == "a":
        art, endings = [INDEFINITE[g, case]], MIXED
    else:  # bare plural: strong adjective endings
        art, endings = [], {("pl", c): e for c, e in STRONG_PLURAL.items()}
    adj = [np.adj.de + endings[g, case]] if np.adj else []
    out = art + adj + [np.noun.german(np.plural, case)]
    if np.rel is not None:
        r = np.rel
        if r.subj is None:  # subject relative: the pronoun is nominative, the verb agrees with the head
            out += [",", RELATIVE[g, NOM]]
            out += _np_de(r.obj, r.verb.case) if r.obj else []
            out += _pp_de(r.pp) + [r.verb.final(np.plural), ","]
        else:  # object relative: the pronoun takes the verb's object case
            out += [",", RELATIVE[g, r.verb.case]] + _np_de(r.subj, NOM)
            out += _pp_de(r.pp) + [r.verb.final(r.subj.plural), ","]
    return out


def _pp_de(pp: PP | None) -> list[str]:
    if pp is None:
        return []
    np = _np_de(pp.np, pp.prep.case)
    merged = CONTRACTIONS.get((pp.prep.de, np[0]))
    return [merged, *np[1:]] if merged else [pp.prep.de, *np]


def _clause_de(c: Clause, order: str) -> list[str]:
    """German clause in "main" (S V O), "inverted" (V S O, after a fronted element) or "sub"
    (S O V) order."""
    subj = _np_de(c.subj, NOM)
    rest = (_np_de(c.obj, c.verb.case) if c.obj else []) + _pp_de(c.pp)
    if order == "sub":
        return subj + rest + [c.verb.final(c.subj.plural)]
    verb = [c.verb.finite(c.subj.plural)]
    head = subj + verb if order == "main" else verb + subj
    out = head + rest + ([c.verb.prefix] if c.verb.prefix else [])
    if c.comp is not None:
        out += [",", COMPLEMENTIZER[1]] + _clause_de(c.comp, "sub")
    return out


def render_german(s: Sentence) -> str:
    """The German translation of a tree, as space-separated tokens."""
    if s.fronted:
        assert s.conj is not None and s.sub is not None
        out = [CONJUNCTIONS[s.conj], *_clause_de(s.sub, "sub"), ",", *_clause_de(s.main, "inverted")]
    elif s.adverb:
        out = [ADVERBS[s.adverb], *_clause_de(s.main, "inverted")]
    else:
        out = _clause_de(s.main, "main")
    if s.sub is not None and not s.fronted:
        assert s.conj is not None
        out += [",", CONJUNCTIONS[s.conj], *_clause_de(s.sub, "sub")]
    # A relative clause closes with a comma; it merges with a following comma and drops at the end.
    tokens: list[str] = []
    for tok in out:
        if not (tok == "," and tokens and tokens[-1] == ","):
            tokens.append(tok)
    if tokens and tokens[-1] == ",":
        tokens.pop()
    return " ".join(tokens)


# --------------------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GrammarOptions:
    """How often each construction is drawn, and the sentence length range (English words).

    The defaults give sentences of 4-20 words with every construction common enough to be learnt.
    Lower the probabilities (or ``max_words``) for an easier task.
    """

    p_plural: float = 0.4
    p_indefinite: float = 0.25  # of singular noun phrases ("a dog")
    p_bare_plural: float = 0.25  # of plural noun phrases ("dogs")
    p_adjective: float = 0.25
    p_relative: float = 0.3  # subject carries a relative clause
    p_object_relative: float = 0.4  # of relative clauses
    p_pp: float = 0.3
    p_clausal: float = 0.12  # main verb takes a that-clause
    p_adverb: float = 0.15
    p_subordinate: float = 0.35
    p_fronted: float = 0.4  # of subordinate clauses
    min_words: int = 4
    max_words: int = 20

    def __post_init__(self) -> None:
        problems = [
            f"{name}={value} is not a probability in [0, 1]"
            for name, value in vars(self).items()
            if name.startswith("p_") and not 0.0 <= value <= 1.0
        ]
        if not 3 <= self.min_words <= self.max_words:
            problems.append(f"need 3 <= min_words <= max_words, got {self.min_words} and {self.max_words}")
        if problems:
            raise AiaynError("GrammarOptions: " + "; ".join(problems))


def _sample_np(rng: random.Random, o: GrammarOptions, kinds: Sequence[str]) -> NP:
    noun = rng.choice([n for n in NOUNS if n.kind in kinds])
    plural = rng.random() < o.p_plural
    if plural:
        det = "" if rng.random() < o.p_bare_plural else "the"
    else:
        det = "a" if rng.random() < o.p_indefinite else "the"
    adj = rng.choice([a for a in ADJS if noun.kind in a.nouns]) if rng.random() < o.p_adjective else None
    return NP(noun, plural, det, adj)


def _sample_pp(rng: random.Random, o: GrammarOptions) -> PP | None:
    if rng.random() >= o.p_pp:
        return None
    prep = rng.choice(PREPS)
    return PP(prep, _sample_np(rng, o, prep.objects))


def _sample_verb(rng: random.Random, kinds: Sequence[str]) -> Verb:
    return rng.choice([v for v in VERBS if v.kind in kinds])


def _sample_rel(rng: random.Random, o: GrammarOptions) -> Rel:
    if rng.random() < o.p_object_relative:
        verb = _sample_verb(rng, ("trans",))
        return Rel(verb, subj=_sample_np(rng, o, _ANIMATE), pp=_sample_pp(rng, o))
    verb = _sample_verb(rng, ("trans", "intrans"))
    obj = _sample_np(rng, o, verb.objects) if verb.kind == "trans" else None
    return Rel(verb, obj=obj, pp=_sample_pp(rng, o))


def _sample_clause(rng: random.Random, o: GrammarOptions, main: bool) -> Clause:
    subj = _sample_np(rng, o, _ANIMATE)
    if rng.random() < o.p_relative:
        subj = NP(subj.noun, subj.plural, subj.det, subj.adj, _sample_rel(rng, o))
    if main and rng.random() < o.p_clausal:
        return Clause(subj, _sample_verb(rng, ("clausal",)), comp=_sample_clause(rng, o, main=False))
    verb = _sample_verb(rng, ("trans", "intrans"))
    obj = _sample_np(rng, o, verb.objects) if verb.kind == "trans" else None
    return Clause(subj, verb, obj, _sample_pp(rng, o))


def sample_sentence(rng: random.Random, options: GrammarOptions | None = None) -> Sentence:
    """Draw one sentence tree (any length; :func:`generate_pairs` filters by length)."""
    o = options or GrammarOptions()
    main = _sample_clause(rng, o, main=True)
    if rng.random() < o.p_subordinate:
        conj = rng.choice(sorted(CONJUNCTIONS))
        sub = _sample_clause(rng, o, main=False)
        if rng.random() < o.p_fronted:
            return Sentence(main, conj=conj, sub=sub, fronted=True)
        if main.comp is None:  # "X says that Y because Z" would be ambiguous in English
            adverb = rng.choice(sorted(ADVERBS)) if rng.random() < o.p_adverb else None
            return Sentence(main, adverb=adverb, conj=conj, sub=sub)
    adverb = rng.choice(sorted(ADVERBS)) if rng.random() < o.p_adverb else None
    return Sentence(main, adverb=adverb)


def generate_pairs(n: int, seed: int, options: GrammarOptions | None = None) -> list[tuple[str, str]]:
    """Draw ``n`` (English, German) pairs, deterministically from ``seed``.

    Pairs may repeat (short sentences are drawn more than once); :func:`generate_corpus` gives
    distinct ones.

    Raises:
        AiaynError: if almost no sentence fits the length range of ``options``.

    Args:
        n: number of pairs.
        seed: random seed; the same seed (and options) always gives the same pairs.
        options: construction probabilities and length range; defaults to :class:`GrammarOptions`.

    Returns:
        A list of ``(english, german)`` strings with space-separated tokens.
    """
    o = options or GrammarOptions()
    rng = random.Random(seed)
    pairs: list[tuple[str, str]] = []
    draws = 0
    while len(pairs) < n:
        if draws >= 20 * n + 20_000:
            raise AiaynError(
                f"generate_pairs: only {len(pairs)} of {draws} drawn sentences have "
                f"{o.min_words}-{o.max_words} words; widen the length range in GrammarOptions"
            )
        draws += 1
        s = sample_sentence(rng, o)
        en = render_english(s)
        if o.min_words <= len(en.split()) <= o.max_words:
            pairs.append((en, render_german(s)))
    return pairs


def train_test_split(
    pairs: Sequence[tuple[str, str]], n_test: int, seed: int
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Split pairs into (train, test) with no English sentence in both.

    Duplicates are dropped (first occurrence kept), the distinct pairs shuffled with ``seed``, and
    the first ``n_test`` of them held out.

    Raises:
        AiaynError: if there are fewer than ``n_test`` distinct sentences.
    """
    seen: dict[str, str] = {}  # first occurrence wins, order kept
    for en, de in pairs:
        seen.setdefault(en, de)
    distinct = list(seen.items())
    if n_test > len(distinct):
        raise AiaynError(
            f"train_test_split: asked for {n_test} test pairs but there are only {len(distinct)} "
            "distinct sentences; generate more pairs or lower n_test"
        )
    random.Random(seed).shuffle(distinct)
    return distinct[n_test:], distinct[:n_test]


def generate_corpus(
    n_train: int, n_valid: int, n_test: int, seed: int, options: GrammarOptions | None = None
) -> dict[str, list[tuple[str, str]]]:
    """Generate disjoint train/valid/test splits of distinct sentence pairs.

    Args:
        n_train, n_valid, n_test: sizes of the splits.
        seed: random seed; the same arguments always give the same corpus.
        options: construction probabilities and length range.

    Returns:
        ``{"train": [...], "valid": [...], "test": [...]}``, no English sentence in two splits.

    Raises:
        AiaynError: if the grammar cannot supply that many distinct sentences.
    """
    total = n_train + n_valid + n_test
    o = options or GrammarOptions()
    rng = random.Random(seed)
    seen: dict[str, str] = {}
    draws, budget = 0, 20 * total + 20_000
    while len(seen) < total:
        if draws >= budget:
            raise AiaynError(
                f"generate_corpus: found only {len(seen)} distinct sentences in {draws} draws, fewer "
                f"than the {total} asked for; lower the split sizes or widen GrammarOptions "
                "(e.g. max_words)"
            )
        draws += 1
        s = sample_sentence(rng, o)
        en = render_english(s)
        if o.min_words <= len(en.split()) <= o.max_words and en not in seen:
            seen[en] = render_german(s)
    pairs = list(seen.items())
    random.Random(seed + 1).shuffle(pairs)
    return {
        "train": pairs[:n_train],
        "valid": pairs[n_train : n_train + n_valid],
        "test": pairs[n_train + n_valid :],
    }


# --------------------------------------------------------------------------------------------------
# Parsing English back into a tree: the reference translation of any sentence of the grammar
# --------------------------------------------------------------------------------------------------


class _Parser:
    """Recursive-descent parser for the English side of the grammar (one token of look-ahead,
    plus two for the two-word verbs and prepositions)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = text.lower().replace(",", " , ").split()
        self.i = 0
        self.nouns = {n.en: (n, False) for n in NOUNS} | {n.en_pl: (n, True) for n in NOUNS}
        self.verbs = {v.en: (v, False) for v in VERBS} | {v.en_pl: (v, True) for v in VERBS}
        self.preps = {p.en: p for p in PREPS}
        self.adjs = {a.en: a for a in ADJS}

    def fail(self, expected: str) -> AiaynError:
        got = self.toks[self.i] if self.i < len(self.toks) else "the end of the sentence"
        return AiaynError(
            f"cannot translate {self.text!r}: at word {self.i + 1} expected {expected} but found "
            f"{got!r}; use only the grammar of aiayn.data.synthetic (see its vocabulary tables)"
        )

    def peek(self, k: int = 0) -> str | None:
        return self.toks[self.i + k] if self.i + k < len(self.toks) else None

    def multi(self, table: dict) -> object | None:
        """Match a one- or two-word entry of ``table`` at the cursor, longest first."""
        for width in (2, 1):
            key = " ".join(self.toks[self.i : self.i + width])
            if len(self.toks) - self.i >= width and key in table:
                self.i += width
                return table[key]
        return None

    def sentence(self) -> Sentence:
        if self.peek() in CONJUNCTIONS:
            conj = self.toks[self.i]
            self.i += 1
            sub = self.clause(main=False)
            if self.peek() != ",":
                raise self.fail("',' after the fronted clause")
            self.i += 1
            s = Sentence(self.clause(main=True), conj=conj, sub=sub, fronted=True)
        else:
            adverb = None
            if self.peek() in ADVERBS:
                adverb = self.toks[self.i]
                self.i += 1
            main = self.clause(main=True)
            conj = sub = None
            if main.comp is None and self.peek() in CONJUNCTIONS:
                conj = self.toks[self.i]
                self.i += 1
                sub = self.clause(main=False)
            s = Sentence(main, adverb=adverb, conj=conj, sub=sub)
        if self.i != len(self.toks):
            raise self.fail("the end of the sentence")
        return s

    def np(self, relative: bool) -> NP:
        det = ""
        if self.peek() in ("the", "a", "an"):
            det = "a" if self.peek() in ("a", "an") else "the"
            self.i += 1
        adj = self.adjs.get(self.peek() or "")
        if adj is not None:
            self.i += 1
        entry = self.nouns.get(self.peek() or "")
        if entry is None:
            raise self.fail("a noun")
        noun, plural = entry
        if det == "a" and plural:
            raise self.fail("a singular noun after 'a'")
        if det == "" and not plural:
            raise self.fail("'the' or 'a' before a singular noun")
        self.i += 1
        rel = self.rel(plural) if relative and self.peek() == "that" else None
        return NP(noun, plural, det, adj, rel)

    def verb(self, plural: bool, kinds: Sequence[str]) -> Verb:
        start = self.i
        entry = self.multi(self.verbs)
        if entry is None:
            raise self.fail("a verb")
        verb, verb_plural = entry
        if verb_plural != plural or verb.kind not in kinds:
            self.i = start
            number = "plural" if plural else "singular"
            raise self.fail(f"a {number} verb of kind {'/'.join(kinds)}")
        return verb

    def pp(self) -> PP | None:
        prep = self.multi(self.preps)
        return None if prep is None else PP(prep, self.np(relative=False))  # type: ignore[arg-type]

    def rel(self, head_plural: bool) -> Rel:
        self.i += 1  # "that"
        if self.peek() in ("the", "a", "an") or self.peek() in self.adjs or self.peek() in self.nouns:
            subj = self.np(relative=False)
            verb = self.verb(subj.plural, ("trans",))
            return Rel(verb, subj=subj, pp=self.pp())
        verb = self.verb(head_plural, ("trans", "intrans"))
        obj = self.np(relative=False) if verb.kind == "trans" else None
        return Rel(verb, obj=obj, pp=self.pp())

    def clause(self, main: bool) -> Clause:
        subj = self.np(relative=True)
        verb = self.verb(subj.plural, ("trans", "intrans", "clausal") if main else ("trans", "intrans"))
        if verb.kind == "clausal":
            if self.peek() != "that":
                raise self.fail("'that'")
            self.i += 1
            return Clause(subj, verb, comp=self.clause(main=False))
        obj = self.np(relative=False) if verb.kind == "trans" else None
        return Clause(subj, verb, obj, self.pp())


def parse_english(text: str) -> Sentence:
    """Parse an English sentence of the grammar into its tree.

    Raises:
        AiaynError: naming the word where the sentence leaves the grammar.
    """
    return _Parser(text).sentence()


def translate(text: str) -> str:
    """The reference German translation of any English sentence of the grammar.

    Example:
        >>> translate("the dogs that see the cat run")
        'die Hunde , die die Katze sehen , laufen'

    Raises:
        AiaynError: if the sentence is not in the grammar.
    """
    return render_german(parse_english(text))
