"""Anserini's default English analyzer in pure Python: the token stream pyserini indexes and queries with.

The chain (`io.anserini.analysis.DefaultEnglishAnalyzer.newDefaultInstance()`, Lucene 9.9):
StandardTokenizer (UAX#29 word breaks, Unicode 9 classes, tokens chopped at 255 chars) ->
EnglishPossessiveFilter (trailing 's, ’s, ＇s removed) -> LowerCaseFilter -> StopFilter (Lucene's
33 English stop words) -> PorterStemFilter (Porter's reference C version, `porter_stemmer.py`).

The tokenizer maps every character to a one-letter word-break class and runs a regular expression
that transcribes the JFlex grammar of Lucene's `StandardTokenizerImpl` over the class string (a faster
equivalent when no combining, format or joiner characters occur, matched on the text itself when it is ASCII).
Character classes come from `unicodedata` plus the explicit UAX#29 lists; scripts that `unicodedata`
cannot name (Han, Hiragana, Katakana, South-East Asian) use their Unicode blocks. Hebrew-specific rules
(WB7a-c) send the text to the general (slower) pattern.
"""

import functools
import re
import unicodedata

from webshop.porter_stemmer import porter_stem

MAX_TOKEN_LENGTH = 255
ENGLISH_STOP_WORDS = frozenset((
    'a', 'an', 'and', 'are', 'as', 'at', 'be', 'but', 'by', 'for', 'if', 'in', 'into', 'is', 'it', 'no', 'not',
    'of', 'on', 'or', 'such', 'that', 'the', 'their', 'then', 'there', 'these', 'they', 'this', 'to', 'was',
    'will', 'with'))

# Word-break classes, one letter each:
#   A letter (ALetter, Hebrew_Letter)   D digit (Numeric)         K Katakana
#   M MidLetter                         N MidNum                  B MidNumLet (both roles)
#   J Single_Quote (both roles)         W Double_Quote            H Hebrew_Letter
#   U ExtendNumLet                      X Extend or Format        Z zero-width joiner
#   V emoji presentation selector       E emoji (Extended_Pictographic)
#   F emoji skin-tone modifier (an Extend character, or an emoji on its own)
#   Q combining keycap (Extend)         P '#' or '*' (keycap bases)
#   R regional indicator                C Han                     I Hiragana
#   S South-East Asian (Line_Break = Complex_Context)              . anything else (never in a token)
_MID_LETTER = frozenset('\u003a\u00b7\u0387\u05f4\u2027\ufe13\ufe55\uff1a')
_MID_NUM = frozenset('\u002c\u003b\u037e\u0589\u060c\u060d\u066c\u07f8\u2044\ufe10\ufe14\ufe50\ufe54\uff0c\uff1b')
_MID_NUM_LET = frozenset('\u002e\u2018\u2019\u2024\ufe52\uff07\uff0e')
_EXTEND_NUM_LET = frozenset('\u005f\u202f\u203f\u2040\u2054\ufe33\ufe34\ufe4d\ufe4e\ufe4f\uff3f')
_EXTEND_EXTRA = frozenset('\u200c\uff9e\uff9f')
_NOT_FORMAT = frozenset('\u200b\u200c\u200d')
# Extended_Pictographic (Unicode emoji data as bundled with Lucene 9), inclusive ranges.
_PICTOGRAPHIC_RANGES = (
    (0xA9, 0xA9), (0xAE, 0xAE), (0x203C, 0x203C), (0x2049, 0x2049), (0x2122, 0x2122), (0x2139, 0x2139),
    (0x2194, 0x2199), (0x21A9, 0x21AA), (0x231A, 0x231B), (0x2328, 0x2328), (0x2388, 0x2388), (0x23CF, 0x23CF),
    (0x23E9, 0x23F3), (0x23F8, 0x23FA), (0x24C2, 0x24C2), (0x25AA, 0x25AB), (0x25B6, 0x25B6), (0x25C0, 0x25C0),
    (0x25FB, 0x25FE), (0x2600, 0x2605), (0x2607, 0x2612), (0x2614, 0x2685), (0x2690, 0x2705), (0x2708, 0x2712),
    (0x2714, 0x2714), (0x2716, 0x2716), (0x271D, 0x271D), (0x2721, 0x2721), (0x2728, 0x2728), (0x2733, 0x2734),
    (0x2744, 0x2744), (0x2747, 0x2747), (0x274C, 0x274C), (0x274E, 0x274E), (0x2753, 0x2755), (0x2757, 0x2757),
    (0x2763, 0x2767), (0x2795, 0x2797), (0x27A1, 0x27A1), (0x27B0, 0x27B0), (0x27BF, 0x27BF), (0x2934, 0x2935),
    (0x2B05, 0x2B07), (0x2B1B, 0x2B1C), (0x2B50, 0x2B50), (0x2B55, 0x2B55), (0x3030, 0x3030), (0x303D, 0x303D),
    (0x3297, 0x3297), (0x3299, 0x3299), (0x1F000, 0x1F0FF), (0x1F10D, 0x1F10F), (0x1F12F, 0x1F12F),
    (0x1F16C, 0x1F171), (0x1F17E, 0x1F17F), (0x1F18E, 0x1F18E), (0x1F191, 0x1F19A), (0x1F1AD, 0x1F1E5),
    (0x1F201, 0x1F20F), (0x1F21A, 0x1F21A), (0x1F22F, 0x1F22F), (0x1F232, 0x1F23A), (0x1F23C, 0x1F23F),
    (0x1F249, 0x1F3FA), (0x1F400, 0x1F53D), (0x1F546, 0x1F64F), (0x1F680, 0x1F6FF), (0x1F774, 0x1F77F),
    (0x1F7D5, 0x1F7FF), (0x1F80C, 0x1F80F), (0x1F848, 0x1F84F), (0x1F85A, 0x1F85F), (0x1F888, 0x1F88F),
    (0x1F8AE, 0x1F8FF), (0x1F90C, 0x1F93A), (0x1F93C, 0x1F945), (0x1F947, 0x1FAFF), (0x1FC00, 0x1FFFD))
_HAN_RANGES = ((0x2E80, 0x2FDF), (0x3005, 0x3005), (0x3007, 0x3007), (0x3021, 0x3029), (0x3038, 0x303B),
               (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x3FFFF))
_HIRAGANA_RANGES = ((0x3041, 0x3096), (0x309D, 0x309F), (0x1B001, 0x1B11F), (0x1F200, 0x1F200))
_KATAKANA_RANGES = ((0x3031, 0x3035), (0x309B, 0x309C), (0x30A0, 0x30FA), (0x30FC, 0x30FF), (0x31F0, 0x31FF),
                    (0x32D0, 0x32FE), (0x3300, 0x3357), (0xFF66, 0xFF9D), (0x1B000, 0x1B000))
_SOUTH_EAST_ASIAN_RANGES = ((0x0E00, 0x0EFF), (0x1000, 0x109F), (0x1780, 0x17FF), (0x1950, 0x1AAF),
                            (0xA9E0, 0xA9FF), (0xAA60, 0xAADF), (0x11700, 0x1173F))
_EXTRA_LETTER_RANGES = ((0x02C2, 0x02C5), (0x02D2, 0x02D7), (0x02DE, 0x02DF), (0x02E5, 0x02EB), (0x02ED, 0x02ED),
                        (0x02EF, 0x02FF), (0x055A, 0x055C), (0x055E, 0x055E), (0x058A, 0x058A), (0x05F3, 0x05F3),
                        (0x24B6, 0x24E9), (0xA708, 0xA716), (0xA720, 0xA721), (0xA789, 0xA78A), (0xAB5B, 0xAB5B))


def _in_ranges(code: int, ranges) -> bool:
    return any(lo <= code <= hi for lo, hi in ranges)


def word_break_class(char: str) -> str:
    """The one-letter word-break class of a character (see the table above)."""
    code, category = ord(char), unicodedata.category(char)
    if char in _MID_LETTER:
        return 'M'
    if char in _MID_NUM:
        return 'N'
    if char in _MID_NUM_LET:
        return 'B'
    if char == "'":
        return 'J'
    if char == '"':
        return 'W'
    if char in _EXTEND_NUM_LET:
        return 'U'
    if char == '\u200d':
        return 'Z'
    if char in '\ufe0e\ufe0f':
        return 'V'
    if 0x1F3FB <= code <= 0x1F3FF:
        return 'F'
    if char == '\u20e3':
        return 'Q'
    if char in '#*':
        return 'P'
    if 0x1F1E6 <= code <= 0x1F1FF:
        return 'R'
    if _in_ranges(code, _PICTOGRAPHIC_RANGES):
        return 'E'
    if category[0] in 'LM' and _in_ranges(code, _SOUTH_EAST_ASIAN_RANGES):
        return 'S'
    if category in ('Mn', 'Me', 'Mc') or char in _EXTEND_EXTRA or (category == 'Cf' and char not in _NOT_FORMAT):
        return 'X'
    if category == 'Nd':
        return 'D'
    if _in_ranges(code, _KATAKANA_RANGES):
        return 'K'
    if _in_ranges(code, _HAN_RANGES):
        return 'C' if category[0] in 'LN' else '.'
    if _in_ranges(code, _HIRAGANA_RANGES):
        return 'I'
    if category == 'Lo' and (0x05D0 <= code <= 0x05F2 or 0xFB1D <= code <= 0xFB4F):
        return 'H'
    if category in ('Lu', 'Ll', 'Lt', 'Lm', 'Lo', 'Nl') or _in_ranges(code, _EXTRA_LETTER_RANGES):
        return 'A'
    return '.'


def _general_token_pattern() -> re.Pattern:
    """StandardTokenizerImpl's token rules over a class string (greedy: yields JFlex's longest match)."""
    ext = '[XZVFQ]*'   # WB4: Extend, Format and ZWJ characters attach to the character before them
    extend_num_let = f'U{ext}'
    katakana_run = f'K{ext}(?:(?:{extend_num_let})*K{ext})*'
    number_run = f'D{ext}(?:(?:(?:{extend_num_let})*|[NBJ]{ext})D{ext})*'
    free_letter = f'(?:A{ext}|H{ext}+(?!J|W{ext}H))'   # a Hebrew letter before a quote starts WB7a-c
    letter_run = f'{free_letter}(?:(?:{extend_num_let})*{free_letter}|[MBJ]{ext}[AH]{ext})*'
    hebrew_quoted = f'H{ext}(?:J{ext}|W{ext}H{ext})'   # WB7a-c
    core = f'(?:{katakana_run}|(?:{hebrew_quoted}|{number_run}|{letter_run})+)'
    word = f'(?:{extend_num_let})*{core}(?:(?:{extend_num_let})+{core})*(?:{extend_num_let})*'
    emoji_ext = '(?:[XFQ]|Z(?!Z*E))*'   # presentation selectors end an emoji; a joiner before an emoji joins it
    emoji_unit = f'Z*E{emoji_ext}V?|F{emoji_ext}'
    emoji = f'(?:{emoji_unit})(?:Z(?:{emoji_unit}))*|P[XZFQ]*V?Q[XZFQ]*|R{ext}R{ext}'
    single = f'[CI]{ext}|(?:S{ext})+'
    return re.compile(f'{emoji}|{word}|{single}')


def _plain_token_pattern(char_class: dict[str, str], with_other_scripts: bool) -> re.Pattern:
    """The same rules for text without Extend, Format or ZWJ characters and without Hebrew letters
    (so no WB4 or WB7a-c), written to backtrack little.

    `char_class` maps each class letter to a regular-expression character set; `with_other_scripts`
    adds the rules for Katakana, emoji, Han, Hiragana and South-East Asian scripts.
    """
    a, d, u, k = char_class['A'], char_class['D'], char_class['U'], char_class['K']
    letter_or_digit = f'[{a}{d}]'
    after_letter = f'(?<=[{a}])[{char_class["M"]}{char_class["B"]}](?=[{a}])'
    after_digit = f'(?<=[{d}])[{char_class["N"]}{char_class["B"]}](?=[{d}])'
    run = f'(?:{letter_or_digit}++|[{k}]++)' if with_other_scripts else f'{letter_or_digit}++'
    word = (f'[{u}]*+{run}(?:(?:{after_letter}|{after_digit}){letter_or_digit}++|[{u}]++{run})*+[{u}]*+')
    if not with_other_scripts:
        return re.compile(word)
    e, r = char_class['E'], char_class['R']
    others = f'[{e}]|[{r}][{r}]|[{char_class["C"]}{char_class["I"]}]|[{char_class["S"]}]++'
    return re.compile(f'(?=[{a}{d}{k}{u}{e}{r}{char_class["C"]}{char_class["I"]}{char_class["S"]}])'
                      f'(?:{word}|{others})')


_CLASS_LETTERS = {**{letter: letter for letter in 'ADKMNUERCIS'}, 'B': 'BJ'}
_PLAIN_TOKEN = _plain_token_pattern(_CLASS_LETTERS, with_other_scripts=True)
_ASCII_TOKEN = _plain_token_pattern(
    {**_CLASS_LETTERS, 'A': 'A-Za-z', 'D': '0-9', 'M': ':', 'N': ',;', 'B': ".'", 'U': '_'}, with_other_scripts=False)
_GENERAL_TOKEN = _general_token_pattern()
_GENERAL_ONLY_CLASSES = re.compile('[XZVFQH]')   # a double quote matters only after H


class _ClassTable(dict):
    """`str.translate` table: code point -> class letter, filled on first sight of each character."""

    def __missing__(self, code: int) -> str:
        value = self[code] = word_break_class(chr(code))
        return value


_CLASS_TABLE = _ClassTable()


def tokenize(text: str) -> list[str]:
    """Lucene StandardTokenizer: the UAX#29 words, numbers, ideographs and emoji of `text`, case kept."""
    if text.isascii():   # the common case: match the text itself
        tokens = _ASCII_TOKEN.findall(text)
        if max(map(len, tokens), default=0) <= MAX_TOKEN_LENGTH:
            return tokens
    classes = text.translate(_CLASS_TABLE)
    return _scan(_GENERAL_TOKEN if _GENERAL_ONLY_CLASSES.search(classes) else _PLAIN_TOKEN, classes, text)


def _scan(pattern: re.Pattern, classes: str, text: str) -> list[str]:
    """The tokens of `text` that `pattern` finds in its class string `classes`."""
    tokens = []
    for match in pattern.finditer(classes):
        start, end = match.span()
        if end - start <= MAX_TOKEN_LENGTH:
            tokens.append(text[start:end])
        else:
            tokens += _chopped(pattern, classes, text, start, end)
    return tokens


def _chopped(pattern: re.Pattern, classes: str, text: str, start: int, end: int) -> list[str]:
    """Tokens of an over-long span: Lucene's scanner sees 255 characters at a time, takes the longest
    token inside that window and skips a character where none starts."""
    tokens = []
    position = start
    while position < end:
        match = pattern.match(classes, position, min(position + MAX_TOKEN_LENGTH, end))
        if match is None or match.end() == position:
            position += 1
        else:
            tokens.append(text[position:match.end()])
            position = match.end()
    return tokens


def _java_lower(token: str) -> str:
    """`Character.toLowerCase` on each character (Python's `str.lower` may change the length)."""
    if token.isascii():
        return token.lower()
    return ''.join(lowered if len(lowered := char.lower()) == 1 else char for char in token).replace('\u0130', 'i')


def _strip_possessive(token: str) -> str:
    if len(token) >= 2 and token[-1] in 'sS' and token[-2] in "'\u2019\uff07":
        return token[:-2]
    return token


@functools.lru_cache(maxsize=1 << 18)
def _term(token: str) -> str | None:
    """The indexed term of one token, None for a stop word."""
    word = _java_lower(_strip_possessive(token))
    return None if word in ENGLISH_STOP_WORDS else porter_stem(word)


def analyze(text: str) -> list[str]:
    """Index/query terms of `text` as `DefaultEnglishAnalyzer.newDefaultInstance()` makes them, in order."""
    return [term for term in map(_term, tokenize(text)) if term is not None]
