"""The Porter stemmer exactly as Lucene's `PorterStemFilter` applies it.

Lucene implements Martin Porter's reference C version, which departs from the 1980 paper (and from
Snowball's "porter", e.g. PyStemmer): step 2 maps -bli to -ble (not -abli to -able) and adds -logi -> -log,
and words of one or two characters are never stemmed. Only the letters a, e, i, o, u (and y after a
consonant) count as vowels; any other character, digits and non-ASCII letters included, is a consonant.
"""

import functools

_STEP2_RULES = {
    'a': (('ational', 'ate'), ('tional', 'tion')),
    'c': (('enci', 'ence'), ('anci', 'ance')),
    'e': (('izer', 'ize'),),
    'l': (('bli', 'ble'), ('alli', 'al'), ('entli', 'ent'), ('eli', 'e'), ('ousli', 'ous')),
    'o': (('ization', 'ize'), ('ation', 'ate'), ('ator', 'ate')),
    's': (('alism', 'al'), ('iveness', 'ive'), ('fulness', 'ful'), ('ousness', 'ous')),
    't': (('aliti', 'al'), ('iviti', 'ive'), ('biliti', 'ble')),
    'g': (('logi', 'log'),),
}
_STEP3_RULES = {
    'e': (('icate', 'ic'), ('ative', ''), ('alize', 'al')),
    'i': (('iciti', 'ic'),),
    'l': (('ical', 'ic'), ('ful', '')),
    's': (('ness', ''),),
}
_STEP4_SUFFIXES = {
    'a': ('al',), 'c': ('ance', 'ence'), 'e': ('er',), 'i': ('ic',), 'l': ('able', 'ible'),
    'n': ('ant', 'ement', 'ment', 'ent'), 'o': ('ion', 'ou'), 's': ('ism',), 't': ('ate', 'iti'),
    'u': ('ous',), 'v': ('ive',), 'z': ('ize',),
}


class _VowelTable(dict):
    """`str.translate` table: a, e, i, o, u -> 'v', y -> 'y' (decided by context), anything else -> 'c'."""

    def __missing__(self, code: int) -> str:
        return 'v' if chr(code) in 'aeiou' else 'y' if chr(code) == 'y' else 'c'


_VOWEL_TABLE = _VowelTable()


def _consonant_pattern(word: str) -> str:
    """One 'c' or 'v' per character: y is a vowel after a consonant, a consonant first or after a vowel."""
    pattern = word.translate(_VOWEL_TABLE)
    if 'y' not in pattern:
        return pattern
    resolved = []
    for kind in pattern:
        if kind == 'y':
            kind = 'v' if resolved and resolved[-1] == 'c' else 'c'
        resolved.append(kind)
    return ''.join(resolved)


def _measure(stem: str) -> int:
    """Porter's m: the number of vowel-consonant sequences in `stem`."""
    return _consonant_pattern(stem).count('vc')


def _has_vowel(stem: str) -> bool:
    return 'v' in _consonant_pattern(stem)


def _ends_double_consonant(word: str) -> bool:
    return len(word) >= 2 and word[-1] == word[-2] and _consonant_pattern(word)[-1] == 'c'


def _ends_cvc(word: str) -> bool:
    """Consonant-vowel-consonant ending whose last consonant is not w, x or y."""
    return len(word) >= 3 and _consonant_pattern(word).endswith('cvc') and word[-1] not in 'wxy'


def _step1ab(word: str) -> str:
    if word.endswith('s'):
        if word.endswith('sses'):
            word = word[:-2]
        elif word.endswith('ies'):
            word = word[:-3] + 'i'
        elif word[-2] != 's':
            word = word[:-1]
    if word.endswith('eed'):
        return word[:-1] if _measure(word[:-3]) > 0 else word
    for suffix in ('ed', 'ing'):
        if word.endswith(suffix) and _has_vowel(word[:-len(suffix)]):
            word = word[:-len(suffix)]
            if word.endswith(('at', 'bl', 'iz')):
                return word + 'e'
            if _ends_double_consonant(word):
                return word if word[-1] in 'lsz' else word[:-1]
            if _measure(word) == 1 and _ends_cvc(word):
                return word + 'e'
            return word
        if word.endswith(suffix):
            return word
    return word


def _step1c(word: str) -> str:
    if word.endswith('y') and _has_vowel(word[:-1]):
        return word[:-1] + 'i'
    return word


def _replace_first_suffix(word: str, rules) -> str:
    """The first rule whose suffix `word` ends with decides: replaced when the remaining stem has m > 0."""
    for suffix, replacement in rules:
        if word.endswith(suffix):
            stem = word[:-len(suffix)]
            return stem + replacement if _measure(stem) > 0 else word
    return word


def _step4(word: str) -> str:
    for suffix in _STEP4_SUFFIXES.get(word[-2], ()):
        if word.endswith(suffix):
            stem = word[:-len(suffix)]
            if suffix == 'ion' and not stem.endswith(('s', 't')):
                continue
            return stem if _measure(stem) > 1 else word
    return word


def _step5(word: str) -> str:
    if word.endswith('e'):
        measure = _measure(word)   # Lucene measures with the final e, which never changes m
        if measure > 1 or (measure == 1 and not _ends_cvc(word[:-1])):
            word = word[:-1]
    if word.endswith('l') and _ends_double_consonant(word) and _measure(word) > 1:
        word = word[:-1]
    return word


@functools.lru_cache(maxsize=1 << 16)
def porter_stem(word: str) -> str:
    """Lucene `PorterStemmer.stem` of one lowercased term."""
    if len(word) <= 2:
        return word
    word = _step1c(_step1ab(word))
    if len(word) > 1:
        word = _replace_first_suffix(word, _STEP2_RULES.get(word[-2], ()))
    word = _replace_first_suffix(word, _STEP3_RULES.get(word[-1], ()))
    if len(word) > 1:
        word = _step4(word)
    return _step5(word)
