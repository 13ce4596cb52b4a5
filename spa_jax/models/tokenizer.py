"""Tokenizers with one chat interface: a local Hugging Face (Llama 3) tokenizer and a SentencePiece
model trained on first use.

Chat encoding is built segment by segment, so the assistant mask comes out together with the ids and
a multi-turn episode can be encoded incrementally:

    encode_chat(msgs[:k], add_generation_prompt=True)        # ... <assistant header>
    + encode_assistant_reply(msgs[k]["content"])             # reply tokens + end-of-turn
    + encode_turn_suffix(msgs[k+1:k+2], add_generation_prompt=True)
    + ...
    == encode_chat(msgs)                                     # ids and mask alike

Message content is stripped of surrounding whitespace, as the Llama 3 chat template (`| trim`) and
FastChat's Llama 3 conversation do.
"""

from __future__ import annotations

import abc
import functools
import hashlib
import os
import random
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

ROLES = ("system", "user", "assistant")
Message = Mapping[str, str]


class Tokenizer(abc.ABC):
    """Text <-> token ids plus the chat format. `encode` never adds BOS; `encode_chat` adds it once."""

    bos_id: int
    eos_id: int
    pad_id: int
    end_of_turn_id: int
    vocab_size: int

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without BOS/EOS."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`; special tokens are rendered as their text."""

    @abc.abstractmethod
    def role_header(self, role: str) -> list[int]:
        """Token ids that open a turn of `role` (before its content)."""

    @abc.abstractmethod
    def token_texts(self) -> list[str]:
        """Text of every token id on its own ("" for special tokens), indexed by id."""

    def encode_chat(
        self, messages: Sequence[Message], add_generation_prompt: bool = False
    ) -> tuple[list[int], list[int]]:
        """(ids, assistant_mask) of a whole conversation; mask is 1 on assistant content + its end-of-turn."""
        ids, mask = self.encode_turn_suffix(messages, add_generation_prompt)
        return [self.bos_id] + ids, [0] + mask

    def encode_turn_suffix(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> tuple[list[int], list[int]]:
        """(ids, assistant_mask) of complete turns appended to a conversation, optionally followed by
        the assistant header that prompts the next reply."""
        ids: list[int] = []
        mask: list[int] = []
        for message in messages:
            role, content = _checked_message(message)
            header = self.role_header(role)
            ids += header
            mask += [0] * len(header)
            body = self.encode(content.strip()) + [self.end_of_turn_id]
            ids += body
            mask += [int(role == "assistant")] * len(body)
        if add_generation_prompt:
            header = self.role_header("assistant")
            ids += header
            mask += [0] * len(header)
        return ids, mask

    def encode_assistant_reply(self, content: str) -> tuple[list[int], list[int]]:
        """(ids, mask) of an assistant reply after its header: content + end-of-turn, mask all ones."""
        ids = self.encode(content.strip()) + [self.end_of_turn_id]
        return ids, [1] * len(ids)


def _checked_message(message: Message) -> tuple[str, str]:
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise ValueError(f"chat message role must be one of {ROLES}, got {role!r} in {dict(message)!r}")
    if not isinstance(content, str):
        raise ValueError(f"chat message content must be a str, got {type(content).__name__} in {dict(message)!r}")
    return role, content


# ----------------------------------------------------------------------------------------------
# Hugging Face (Llama 3 chat format)

LLAMA3_SPECIAL_TOKENS = {
    "bos": "<|begin_of_text|>",
    "eos": "<|end_of_text|>",
    "start_header": "<|start_header_id|>",
    "end_header": "<|end_header_id|>",
    "end_of_turn": "<|eot_id|>",
}
LLAMA3_PAD_TOKEN = "<|finetune_right_pad_id|>"


class HFTokenizer(Tokenizer):
    """A local Hugging Face tokenizer directory with the Llama 3 chat format:
    `<|begin_of_text|>` once, then `<|start_header_id|>role<|end_header_id|>\\n\\ncontent<|eot_id|>` per turn.

    No default system message is injected (Llama 3.1+ templates add a "Cutting Knowledge Date" one;
    SPA-RL's FastChat format does not).
    """

    def __init__(self, path: str | os.PathLike):
        from transformers import AutoTokenizer

        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"HF tokenizer directory {path} does not exist; pass the model/tokenizer folder")
        self.path = path
        self._hf = AutoTokenizer.from_pretrained(str(path))
        special_ids = {name: self._hf.convert_tokens_to_ids(tok) for name, tok in LLAMA3_SPECIAL_TOKENS.items()}
        missing = [LLAMA3_SPECIAL_TOKENS[n] for n, i in special_ids.items() if i is None or i == self._hf.unk_token_id]
        if missing:
            raise ValueError(
                f"tokenizer at {path} lacks the Llama 3 chat tokens {missing}; use a Llama 3 tokenizer "
                "or the SentencePiece tokenizer"
            )
        self.bos_id = special_ids["bos"]
        self.eos_id = special_ids["eos"]
        self.end_of_turn_id = special_ids["end_of_turn"]
        self._start_header_id = special_ids["start_header"]
        self._end_header_id = special_ids["end_header"]
        pad = self._hf.convert_tokens_to_ids(LLAMA3_PAD_TOKEN)
        if pad is None or pad == self._hf.unk_token_id:
            pad = self._hf.pad_token_id if self._hf.pad_token_id is not None else self.eos_id
        self.pad_id = pad
        self.vocab_size = len(self._hf)
        self._headers = {role: [self._start_header_id, *self.encode(role), self._end_header_id, *self.encode("\n\n")]
                         for role in ROLES}

    def encode(self, text: str) -> list[int]:
        return self._hf.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        return self._hf.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def role_header(self, role: str) -> list[int]:
        return list(self._headers[role])

    @functools.cached_property
    def _token_texts(self) -> tuple[str, ...]:
        return tuple(self._hf.batch_decode(
            [[i] for i in range(self.vocab_size)], skip_special_tokens=True, clean_up_tokenization_spaces=False
        ))

    def token_texts(self) -> list[str]:
        return list(self._token_texts)


# ----------------------------------------------------------------------------------------------
# SentencePiece (trained on first use)

SPM_CONTROL = {"pad": "<pad>", "unk": "<unk>", "bos": "<s>", "eos": "</s>"}
SPM_ROLE_TOKENS = {role: f"<|{role}|>" for role in ROLES}
SPM_END_OF_TURN = "<|end|>"
SPM_CHAT_SYMBOLS = (*SPM_ROLE_TOKENS.values(), SPM_END_OF_TURN)  # user-defined pieces of the chat format
SPM_MAX_TRAIN_CHARS = 3_000_000  # corpus sample size that keeps training to a few seconds on 2 cores
SPM_CHUNK_CHARS = 2_000  # training "sentences" are line groups below SentencePiece's 4192-byte limit
SPM_TRAIN_THREADS = 2  # fixed, so every machine trains the same model from the same corpus


class SentencePieceTokenizer(Tokenizer):
    """SentencePiece BPE with byte fallback and split digits. Chat format: `<s>` once, then
    `<|role|>\\ncontent<|end|>` per turn; `<|end|>` is the end-of-turn token, `</s>` the EOS."""

    def __init__(self, model_file: str | os.PathLike):
        import sentencepiece as spm

        self.path = Path(model_file)
        if not self.path.is_file():
            raise FileNotFoundError(f"SentencePiece model {self.path} does not exist; train it with train_or_load")
        self._sp = spm.SentencePieceProcessor(model_file=str(self.path))
        self.pad_id = self._sp.pad_id()
        self.bos_id = self._sp.bos_id()
        self.eos_id = self._sp.eos_id()
        self.end_of_turn_id = self._sp.piece_to_id(SPM_END_OF_TURN)
        self._role_ids = {role: self._sp.piece_to_id(tok) for role, tok in SPM_ROLE_TOKENS.items()}
        if self.end_of_turn_id == self._sp.unk_id() or self._sp.unk_id() in self._role_ids.values():
            raise ValueError(
                f"{self.path} lacks the chat symbols; it was not made by SentencePieceTokenizer.train_or_load"
            )
        self.vocab_size = self._sp.get_piece_size()

    @classmethod
    def train_or_load(
        cls, texts: Iterable[str], cache_dir: str | os.PathLike, vocab_size: int = 4096,
        atomic_symbols: Sequence[str] = (),
    ) -> SentencePieceTokenizer:
        """The model for this corpus and vocab size from `cache_dir`, training it (seconds) if absent.

        `atomic_symbols` (e.g. a catalogue's product ids) become one token each wherever they occur,
        on top of the `vocab_size` BPE pieces. The cache key hashes the corpus, the symbols and the
        settings. `vocab_size` is an upper bound: a small corpus yields fewer pieces
        (`hard_vocab_limit=False`). Training is deterministic, so processes that call this with the
        same corpus get identical models (the file is written atomically)."""
        chunks = _corpus_chunks(texts)
        if not chunks:
            raise ValueError("SentencePiece training corpus is empty; pass the catalogue and prompt texts")
        symbols = sorted(set(atomic_symbols))
        key = hashlib.sha256(f"spm-bpe-v1|vocab={vocab_size}|max_chars={SPM_MAX_TRAIN_CHARS}".encode())
        for chunk in chunks:
            key.update(chunk.encode())
            key.update(b"\0")
        for symbol in symbols:
            key.update(b"symbol:" + symbol.encode() + b"\0")
        model_file = Path(cache_dir) / f"spm-{key.hexdigest()[:16]}.model"
        if not model_file.is_file():
            _train_spm(_sample_chunks(chunks), model_file, vocab_size, symbols)
        return cls(model_file)

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode(list(ids))

    def role_header(self, role: str) -> list[int]:
        return [self._role_ids[role]] + self.encode("\n")

    @functools.cached_property
    def _token_texts(self) -> tuple[str, ...]:
        special = lambda i: self._sp.is_control(i) or self._sp.is_unknown(i)  # noqa: E731
        return tuple("" if special(i) else self._sp.decode([i]) for i in range(self.vocab_size))

    def token_texts(self) -> list[str]:
        return list(self._token_texts)


def _corpus_chunks(texts: Iterable[str]) -> list[str]:
    """Texts cut at line ends into chunks of at most ~SPM_CHUNK_CHARS characters (newlines kept)."""
    chunks: list[str] = []
    for text in texts:
        current = ""
        for line in text.splitlines(keepends=True):
            if current and len(current) + len(line) > SPM_CHUNK_CHARS:
                chunks.append(current)
                current = ""
            current += line[: 2 * SPM_CHUNK_CHARS]
        if current:
            chunks.append(current)
    return chunks


def _sample_chunks(chunks: list[str]) -> list[str]:
    total = sum(map(len, chunks))
    if total <= SPM_MAX_TRAIN_CHARS:
        return chunks
    keep = max(1, int(len(chunks) * SPM_MAX_TRAIN_CHARS / total))
    return random.Random(0).sample(chunks, keep)


def _train_spm(chunks: list[str], model_file: Path, vocab_size: int, symbols: Sequence[str] = ()) -> None:
    import sentencepiece as spm

    model_file.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=model_file.parent, suffix=".tmp", delete=False) as out:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(chunks),
            model_writer=out,
            model_type="bpe",
            vocab_size=vocab_size + len(symbols),
            hard_vocab_limit=False,
            byte_fallback=True,
            split_digits=True,
            character_coverage=0.9995,
            normalization_rule_name="identity",
            add_dummy_prefix=False,
            remove_extra_whitespaces=False,
            allow_whitespace_only_pieces=True,
            max_sentence_length=4 * 2 * SPM_CHUNK_CHARS + 16,
            pad_id=0,
            unk_id=1,
            bos_id=2,
            eos_id=3,
            pad_piece=SPM_CONTROL["pad"],
            unk_piece=SPM_CONTROL["unk"],
            bos_piece=SPM_CONTROL["bos"],
            eos_piece=SPM_CONTROL["eos"],
            user_defined_symbols=[*SPM_CHAT_SYMBOLS, *symbols],
            num_threads=SPM_TRAIN_THREADS,
            minloglevel=2,
        )
    os.replace(out.name, model_file)  # atomic: concurrent processes never read a half-written model


# ----------------------------------------------------------------------------------------------


def load_tokenizer(spec: str | os.PathLike) -> Tokenizer:
    """A tokenizer from a path: a `.model` file (SentencePiece) or an HF tokenizer/model directory.
    A `spm:` or `hf:` prefix forces the kind."""
    spec = str(spec)
    kind, _, path = spec.partition(":") if spec.startswith(("spm:", "hf:")) else ("", "", spec)
    if kind == "spm" or (not kind and path.endswith(".model")):
        return SentencePieceTokenizer(path)
    if kind == "hf" or Path(path).is_dir():
        return HFTokenizer(path)
    raise ValueError(
        f"cannot load tokenizer {spec!r}: pass a SentencePiece `.model` file or a Hugging Face tokenizer "
        "directory (optionally prefixed with `spm:` or `hf:`)"
    )
