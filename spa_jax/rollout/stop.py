"""Stop sequences checked on device with a per-token transition table, trimmed exactly on host.

A `StopSequence(parts)` fires once its parts have appeared in the generated text in order, each
after the end of the previous one; the text is then cut before the last part's match. The ReAct
turn stop is `StopSequence(("Action:", "\\n"))`: the newline that ends the `Action:` line.

On device each row carries one int32 state of a character automaton (KMP per part). The host
precomputes `table_vs[token, state]`: the state after reading the token's text from `state`, so
one gather per decoded token advances every row. `state == table_vs.shape[1] - 1` means fired.
Tables are padded to a multiple of STATE_PAD states, so different stop sequences share one compiled
decode loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

STATE_PAD = 16


@dataclasses.dataclass(frozen=True)
class StopSequence:
    """Generation stops once `parts` have appeared in order (e.g. ("Action:", "\\n"))."""

    parts: tuple[str, ...]

    def __post_init__(self):
        object.__setattr__(self, "parts", tuple(self.parts))
        if not self.parts or not all(isinstance(p, str) and p for p in self.parts):
            raise ValueError(f"StopSequence needs one or more non-empty strings, got {self.parts!r}")

    @property
    def num_states(self) -> int:
        """Automaton states: partial matches of every part, unused padding, then the fired state."""
        return -(-(sum(map(len, self.parts)) + 1) // STATE_PAD) * STATE_PAD

    def trim(self, text: str) -> tuple[str, bool]:
        """(text cut before the last part's match, whether the sequence occurs)."""
        start, end = 0, 0
        for part in self.parts:
            start = text.find(part, end)
            if start < 0:
                return text, False
            end = start + len(part)
        return text[:start], True


REACT_ACTION_LINE = StopSequence(("Action:", "\n"))


def _char_automaton(stop: StopSequence) -> tuple[np.ndarray, dict[str, int]]:
    """delta_sc[state, char_class] over the part characters (class 0 = any other character)."""
    classes = {c: i + 1 for i, c in enumerate(sorted(set("".join(stop.parts))))}
    delta_sc = np.zeros((stop.num_states, len(classes) + 1), np.int32)
    delta_sc[:] = np.arange(stop.num_states)[:, None]  # padding states (never entered) and the fired one stay
    offset = 0
    for part in stop.parts:
        for matched in range(len(part)):
            delta_sc[offset + matched, 0] = offset  # a character outside every part restarts this part
            for char, cls in classes.items():
                # Longest suffix of part[:matched] + char that is a prefix of part (KMP, by brute force).
                seen = part[:matched] + char
                k = next(k for k in range(len(seen), -1, -1) if part.startswith(seen[len(seen) - k :]))
                delta_sc[offset + matched, cls] = offset + k
        offset += len(part)
    matching_sc = delta_sc[:offset]
    matching_sc[matching_sc == offset] = stop.num_states - 1  # completing the last part fires
    return delta_sc, classes


def build_stop_table(stop: StopSequence, token_texts: Sequence[str], vocab_size: int) -> np.ndarray:
    """table_vs[token, state] -> next state for every token id below `vocab_size` (ids without a
    text, e.g. beyond the tokenizer's vocabulary, leave the state unchanged)."""
    if len(token_texts) > vocab_size:
        raise ValueError(
            f"tokenizer has {len(token_texts)} tokens but the model vocabulary is {vocab_size}; "
            "use a model whose vocab_size covers the tokenizer"
        )
    delta_sc, classes = _char_automaton(stop)
    texts = list(token_texts) + [""] * (vocab_size - len(token_texts))
    lengths_v = np.fromiter(map(len, texts), np.int64, count=vocab_size)
    codepoints = np.frombuffer("".join(texts).encode("utf-32-le"), np.uint32)
    classes_c = np.zeros(codepoints.shape, np.int32)
    for char, cls in classes.items():
        classes_c[codepoints == ord(char)] = cls
    token_of_c = np.repeat(np.arange(vocab_size), lengths_v)
    offset_in_token_c = np.arange(codepoints.size) - np.repeat(np.cumsum(lengths_v) - lengths_v, lengths_v)
    classes_vl = np.zeros((vocab_size, max(1, lengths_v.max())), np.int32)
    classes_vl[token_of_c, offset_in_token_c] = classes_c
    table_vs = np.broadcast_to(np.arange(stop.num_states, dtype=np.int32), (vocab_size, stop.num_states)).copy()
    num_classes = delta_sc.shape[1]
    delta_flat = delta_sc.reshape(-1)
    for j in range(classes_vl.shape[1]):
        live_v = lengths_v > j
        table_vs[live_v] = delta_flat[table_vs[live_v] * num_classes + classes_vl[live_v, j, None]]
    return table_vs

