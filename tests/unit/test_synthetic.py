"""The toy English -> German grammar: determinism, correct German, agreement, disjoint splits."""

from __future__ import annotations

import re

import pytest

from aiayn.data.synthetic import (
    NOUNS,
    VERBS,
    GrammarOptions,
    generate_corpus,
    generate_pairs,
    parse_english,
    render_english,
    train_test_split,
    translate,
)
from aiayn.errors import AiaynError

PAIRS = generate_pairs(4000, seed=7)
EN_PLURAL = {n.en_pl for n in NOUNS}
EN_SINGULAR = {n.en for n in NOUNS}
DE_SG = {v.de for v in VERBS}
DE_PL = {v.de_pl for v in VERBS}


def test_same_seed_same_pairs_and_other_seed_differs() -> None:
    assert generate_pairs(300, seed=7) == PAIRS[:300]
    assert generate_pairs(300, seed=8) != PAIRS[:300]


@pytest.mark.parametrize(
    ("english", "german"),
    [
        ("the cat sleeps because the dog sees the ball", "die Katze schläft , weil der Hund den Ball sieht"),
        (
            "because the dog sees the ball , the cat sleeps",
            "weil der Hund den Ball sieht , schläft die Katze",
        ),
        ("the dogs that see the cat run", "die Hunde , die die Katze sehen , laufen"),
        ("the dog plays with the cat", "der Hund spielt mit der Katze"),
        ("the girl plays with the young dogs", "das Mädchen spielt mit den jungen Hunden"),
        ("the man helps a woman in the garden", "der Mann hilft einer Frau im Garten"),
        ("today an old man picks up the red ball", "heute hebt ein alter Mann den roten Ball auf"),
        (
            "the woman sleeps when the child picks up a book",
            "die Frau schläft , wenn das Kind ein Buch aufhebt",
        ),
        ("the dog that the cats help sleeps", "der Hund , dem die Katzen helfen , schläft"),
        ("dogs that the cat follows wake up", "Hunde , denen die Katze folgt , wachen auf"),
        (
            "the children say that the women look at a small horse",
            "die Kinder sagen , dass die Frauen ein kleines Pferd anschauen",
        ),
        ("a small girl waits without a big dog", "ein kleines Mädchen wartet ohne einen großen Hund"),
        ("big dogs see the child that sleeps", None),  # relative clauses only on subjects
    ],
)
def test_hand_checked_translations(english: str, german: str | None) -> None:
    if german is None:
        with pytest.raises(AiaynError, match="word 6"):
            translate(english)
    else:
        assert translate(english) == german


def test_german_is_a_function_of_the_english() -> None:
    """Parsing the English back and re-rendering gives the same German for every generated pair."""
    for en, de in PAIRS[:1500]:
        assert translate(en) == de, en
        assert render_english(parse_english(en)) == en


def test_lengths_and_casing() -> None:
    lengths = [len(en.split()) for en, _ in PAIRS]
    assert min(lengths) >= 4 and max(lengths) <= 20
    assert all(en == en.lower() for en, _ in PAIRS)
    nouns_de = {n.de for n in NOUNS} | {n.de_pl for n in NOUNS} | {n.de_pl + "n" for n in NOUNS}
    for _, de in PAIRS:
        for tok in de.split():
            assert tok[0].isupper() == (tok in nouns_de), de


def test_plural_subject_takes_plural_verb() -> None:
    """Simple subject (no adjective, no relative clause) at the start: check the German verb."""
    checked = 0
    for en, de in PAIRS:
        m = re.match(r"(the )?(\w+) (\w+)", en)
        if not m or m.group(2) not in EN_PLURAL | EN_SINGULAR or "that" in en.split()[:3]:
            continue
        toks = de.split()
        verb = toks[2] if m.group(1) else toks[1]
        plural = m.group(2) in EN_PLURAL
        assert verb in (DE_PL if plural else DE_SG), (en, de)
        if m.group(1):
            assert (toks[0] == "die") if plural else (toks[0] in ("der", "die", "das")), (en, de)
        checked += 1
    assert checked > 500


def test_main_verb_after_relative_clause_agrees_with_distant_subject() -> None:
    """'the dogs that ... run' -> 'die Hunde , die ... , laufen': the verb after the closing comma
    agrees with the head noun, not with the nouns inside the relative clause."""
    checked = 0
    for en, de in PAIRS:
        m = re.match(r"(?:the |an? )?(\w+) that ", en)
        if not m or m.group(1) not in EN_PLURAL | EN_SINGULAR:
            continue
        toks = de.split(" , ")
        assert len(toks) >= 3, de
        verb = toks[2].split()[0]
        assert verb in (DE_PL if m.group(1) in EN_PLURAL else DE_SG), (en, de)
        checked += 1
    assert checked > 200


def test_verb_final_in_subordinate_clauses() -> None:
    finals = DE_SG | DE_PL | {v.prefix + f for v in VERBS for f in (v.de, v.de_pl)}
    checked = 0
    for _, de in PAIRS:
        for part in re.findall(
            r"(?:weil|wenn|dass) ([^,]+?)(?: , (?!der |die |das |den |dem |denen )|$)", de
        ):
            assert part.split()[-1] in finals, de
            checked += 1
    assert checked > 500


def test_accusative_and_dative() -> None:
    assert translate("the cat sees the dog") == "die Katze sieht den Hund"
    assert translate("the cat follows the dog") == "die Katze folgt dem Hund"
    assert translate("the cat sees the dogs") == "die Katze sieht die Hunde"
    assert translate("the cat follows the dogs") == "die Katze folgt den Hunden"
    assert translate("the cat sleeps behind the cars") == "die Katze schläft hinter den Autos"


def test_splits_are_disjoint_and_deterministic() -> None:
    corpus = generate_corpus(2000, 200, 300, seed=3)
    assert [len(corpus[k]) for k in ("train", "valid", "test")] == [2000, 200, 300]
    train = {en for en, _ in corpus["train"]}
    valid = {en for en, _ in corpus["valid"]}
    test = {en for en, _ in corpus["test"]}
    assert len(train) == 2000 and not train & test and not train & valid and not valid & test
    assert generate_corpus(2000, 200, 300, seed=3) == corpus


def test_train_test_split_dedupes() -> None:
    pairs = PAIRS + PAIRS[:500]
    train, test = train_test_split(pairs, n_test=400, seed=0)
    assert len(test) == 400
    assert not {en for en, _ in train} & {en for en, _ in test}
    assert len(train) + len(test) == len(set(PAIRS))
    with pytest.raises(AiaynError, match="only"):
        train_test_split(PAIRS[:10], n_test=11, seed=0)


def test_too_small_grammar_is_reported() -> None:
    """With every option off and 3 words at most, only 'the <animate noun> <one-word intransitive
    verb>' remains: 11 * 5 = 55 sentences."""
    off = dict.fromkeys(
        [
            "p_plural",
            "p_indefinite",
            "p_adjective",
            "p_relative",
            "p_pp",
            "p_clausal",
            "p_adverb",
            "p_subordinate",
        ],
        0.0,
    )
    tiny = GrammarOptions(**off, min_words=3, max_words=3)
    assert len(generate_corpus(50, 0, 5, seed=0, options=tiny)["train"]) == 50
    with pytest.raises(AiaynError, match="found only 55 distinct sentences"):
        generate_corpus(50, 0, 6, seed=0, options=tiny)


def test_bad_options_are_reported() -> None:
    with pytest.raises(AiaynError, match="p_pp=1.5 is not a probability.*min_words"):
        GrammarOptions(p_pp=1.5, min_words=9, max_words=8)
    short = GrammarOptions(min_words=3, max_words=3, p_plural=0.0, p_indefinite=0.0, p_relative=1.0)
    with pytest.raises(AiaynError, match="widen the length range"):
        generate_pairs(10, seed=0, options=short)


def test_sentence_space_is_large() -> None:
    """30k draws are almost all distinct: far more than 50k sentences are possible (with only 50k
    equally likely ones, 30k draws would give about 22.5k distinct)."""
    pairs = generate_pairs(30_000, seed=11)
    assert len({en for en, _ in pairs}) > 28_500
