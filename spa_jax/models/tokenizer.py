"""Tokenizers with one chat interface: a local Hugging Face tokenizer, whose chat format is its own
chat template (Llama 3, ChatML, ...), and a SentencePiece model trained on first use.

Chat encoding is built segment by segment, so the assistant mask comes out together with the ids and
a multi-turn episode can be encoded incrementally:

    encode_chat(msgs[:k], add_generation_prompt=True)        # ... <assistant header>
    + encode_assistant_reply(msgs[k]["content"])             # reply tokens + end-of-turn
    + encode_turn_suffix(msgs[k+1:k+2], add_generation_prompt=True)
    + ...
    == encode_chat(msgs)                                     # ids and mask alike

The mask is 1 on each assistant reply's content and its end-of-turn token. A conversation encoded
without a generation prompt ends at its last end-of-turn token, as a generated episode does: what a
chat template writes after it (ChatML's "\n") opens the next turn, so it starts `encode_turn_suffix`.
Message content is stripped of surrounding whitespace, as the Llama 3 chat template (`| trim`) and
FastChat's Llama 3 conversation do.
"""

from __future__ import annotations

import abc
import functools
import hashlib
import os
import random
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

ROLES = ("system", "user", "assistant")
Message = Mapping[str, str]


class Tokenizer(abc.ABC):
    """Text <-> token ids plus the chat format. `encode` never adds BOS or EOS."""

    bos_id: int | None
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
    def token_texts(self) -> list[str]:
        """Text of every token id on its own ("" for special tokens), indexed by id."""

    @abc.abstractmethod
    def encode_chat(
        self, messages: Sequence[Message], add_generation_prompt: bool = False
    ) -> tuple[list[int], list[int]]:
        """(ids, assistant_mask) of a whole conversation; mask is 1 on assistant content + its end-of-turn."""

    def encode_chats(self, conversations: Sequence[Sequence[Message]]) -> list[tuple[list[int], list[int]]]:
        """`encode_chat` of each conversation (without generation prompt); a tokenizer may batch them."""
        return [self.encode_chat(messages) for messages in conversations]

    @abc.abstractmethod
    def encode_turn_suffix(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> tuple[list[int], list[int]]:
        """(ids, assistant_mask) of complete turns appended to a conversation that ends at an
        end-of-turn token, optionally followed by the assistant header that prompts the next reply."""

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
# Hugging Face (the tokenizer's own chat template)

LLAMA3_SPECIAL_TOKENS = {
    "bos": "<|begin_of_text|>",
    "eos": "<|end_of_text|>",
    "start_header": "<|start_header_id|>",
    "end_header": "<|end_header_id|>",
    "end_of_turn": "<|eot_id|>",
}
LLAMA3_PAD_TOKEN = "<|finetune_right_pad_id|>"
# The Llama 3 (8B-Instruct) chat template, which is FastChat's Llama 3 conversation (SPA-RL's format).
# Llama 3 tokenizers use it in place of their own: the 3.1+ templates insert a dated default system
# message ("Cutting Knowledge Date", "Today Date") that SPA-RL's format does not have.
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
_SLOT = "\0{}\0"  # stands for a message's content while the template is rendered
_SLOT_PATTERN = re.compile("\0(\\d+)\0")
_MEMO_TEXTS = 4096  # recently encoded texts an HFTokenizer keeps (cleared when full)
_CONTEXT = ({"role": "user", "content": "Hello"}, {"role": "assistant", "content": "OK"})
# Checked at load time: segment-wise encoding must equal the template's one-shot encoding of this.
_PROBE = (
    {"role": "system", "content": "You are web shopping."},
    {"role": "user", "content": "Observation:\nWebShop [SEP] Instruction: [SEP] red shoes, 6.76 oz [SEP] Search"},
    {"role": "assistant", "content": "Thought: I should search.\nAction: search[red shoes]"},
    {"role": "user", "content": "Observation:\n[SEP] B000VOHH8I [SEP] Red Shoe [SEP] $12.00"},
)


class HFTokenizer(Tokenizer):
    """A local Hugging Face tokenizer directory; the chat format is its chat template (Llama 3
    tokenizers: LLAMA3_CHAT_TEMPLATE).

    The template is rendered with a placeholder for each message's content; the text between
    placeholders is the format (BOS, a default system message, role headers, end-of-turn tokens,
    separators), encoded apart from the contents. The end-of-turn token is the special token the
    template writes right after an assistant reply (`<|eot_id|>`, ChatML's `<|im_end|>`). Loading
    checks that this segment-wise encoding equals `apply_chat_template`'s on a probe conversation.
    """

    def __init__(self, path: str | os.PathLike):
        from transformers import AutoTokenizer

        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"HF tokenizer directory {path} does not exist; pass the model/tokenizer folder")
        self.path = path
        self._hf = AutoTokenizer.from_pretrained(str(path))
        self._memo: dict[str, tuple[int, ...]] = {}
        self._format_memo: dict[tuple[tuple[str, ...], bool], list[str]] = {}
        llama3_ids = {name: self._token_id(tok) for name, tok in LLAMA3_SPECIAL_TOKENS.items()}
        if None not in llama3_ids.values():
            self._hf.chat_template = LLAMA3_CHAT_TEMPLATE  # also what an export of this tokenizer saves
            self.bos_id, self.eos_id = llama3_ids["bos"], llama3_ids["eos"]
            pad = self._token_id(LLAMA3_PAD_TOKEN)
        elif self._hf.chat_template:
            self.bos_id, self.eos_id, pad = self._hf.bos_token_id, self._hf.eos_token_id, None
        else:
            raise ValueError(
                f"tokenizer at {path} has no chat template, so the agent's conversation cannot be formatted: "
                "use the tokenizer of an instruction-tuned model (its tokenizer_config.json or "
                "chat_template.jinja carries one), or the SentencePiece tokenizer (tokenizer.kind=sentencepiece)"
            )
        self.vocab_size = len(self._hf)
        self.end_of_turn_id = self._end_of_turn_id()
        if self.eos_id is None:
            self.eos_id = self.end_of_turn_id
        self.pad_id = next(i for i in (pad, self._hf.pad_token_id, self.eos_id) if i is not None)
        self._check_against_template()

    def _token_id(self, token: str) -> int | None:
        token_id = self._hf.convert_tokens_to_ids(token)
        return None if token_id is None or token_id == self._hf.unk_token_id else token_id

    def encode(self, text: str) -> list[int]:
        return self._hf.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        return self._hf.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _formats(self, roles: tuple[str, ...], add_generation_prompt: bool) -> list[str]:
        """The template's text before each message's content, and after the last one (rendered once per
        sequence of roles)."""
        key = (roles, add_generation_prompt)
        if key not in self._format_memo:
            slots = [{"role": role, "content": _SLOT.format(i)} for i, role in enumerate(roles)]
            text = self._hf.apply_chat_template(slots, add_generation_prompt=add_generation_prompt, tokenize=False)
            parts = _SLOT_PATTERN.split(text)  # format, slot index, format, ..., format
            if [int(i) for i in parts[1::2]] != list(range(len(roles))):
                raise ValueError(f"the chat template of {self.path} does not write each message's content once, "
                                 "in order; spa_jax cannot encode its turns incrementally: use another tokenizer")
            self._format_memo[key] = parts[::2]
        return self._format_memo[key]

    def _segment_texts(self, messages: Sequence[Message], add_generation_prompt: bool) -> list[str]:
        """[format_0, content_0, format_1, ..., content_{n-1}, format_n], where format_i is the template's
        text before message i's content (format_n: after the last one)."""
        formats = self._formats(tuple(_checked_message(message)[0] for message in messages), add_generation_prompt)
        contents = [message["content"].strip() for message in messages]
        return [text for pair in zip(formats, contents) for text in pair] + formats[-1:]

    def _segments(self, messages: Sequence[Message], add_generation_prompt: bool) -> list[list[int]]:
        """`_segment_texts` as token ids."""
        return self._encode_texts(self._segment_texts(messages, add_generation_prompt))

    def _encode_texts(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids. Texts seen lately (the template's format text, the shared prompt's messages)
        come from a memo; the others are encoded in one batched call (per-text calls cost ~0.1 ms each)."""
        missing = list(dict.fromkeys(text for text in texts if text not in self._memo))
        if missing:
            if len(self._memo) + len(missing) > _MEMO_TEXTS:
                self._memo.clear()
                missing = list(dict.fromkeys(texts))
            self._memo.update(zip(missing, map(tuple, self._hf(missing, add_special_tokens=False)["input_ids"])))
        return [list(self._memo[text]) for text in texts]

    def _end_of_turn_id(self) -> int:
        after_reply = self._segments(_CONTEXT, add_generation_prompt=False)[-1]
        special = set(self._hf.all_special_ids) | {i for i, t in self._hf.added_tokens_decoder.items() if t.special}
        if not after_reply or after_reply[0] not in special:
            raise ValueError(f"the chat template of {self.path} does not end an assistant reply with a special "
                             f"token (it writes {self.decode(after_reply)!r}); spa_jax needs one to stop "
                             "generation: use another tokenizer")
        return after_reply[0]

    def _encode_segments(self, roles: Sequence[str], segments: list[list[int]],
                         add_generation_prompt: bool) -> tuple[list[int], list[int]]:
        if not add_generation_prompt and roles:  # end at the last end-of-turn (module docstring)
            segments[-1] = segments[-1][:1]
        ids: list[int] = []
        mask: list[int] = []
        for i, segment in enumerate(segments):
            if i % 2:  # a message's content
                bit = int(roles[i // 2] == "assistant")
                mask += [bit] * len(segment)
            else:  # format text; its first token ends the previous message's turn
                bit = int(i > 0 and roles[i // 2 - 1] == "assistant")
                mask += [bit] * min(1, len(segment)) + [0] * (len(segment) - 1)
            ids += segment
        return ids, mask

    def encode_chat(
        self, messages: Sequence[Message], add_generation_prompt: bool = False
    ) -> tuple[list[int], list[int]]:
        roles = [message.get("role") for message in messages]
        return self._encode_segments(roles, self._segments(messages, add_generation_prompt), add_generation_prompt)

    def encode_chats(self, conversations: Sequence[Sequence[Message]]) -> list[tuple[list[int], list[int]]]:
        """`encode_chat` of each conversation, every distinct text of them encoded in one batched call (the
        tokenizer spreads a batch over its threads, and a call per conversation costs ~1 ms)."""
        texts = [self._segment_texts(messages, add_generation_prompt=False) for messages in conversations]
        distinct = list(dict.fromkeys(text for conversation_texts in texts for text in conversation_texts))
        ids = dict(zip(distinct, self._hf(distinct, add_special_tokens=False)["input_ids"]))
        return [self._encode_segments([message.get("role") for message in messages],
                                      [list(ids[text]) for text in conversation_texts], add_generation_prompt=False)
                for messages, conversation_texts in zip(conversations, texts)]

    def encode_turn_suffix(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> tuple[list[int], list[int]]:
        """The turns rendered after a user/assistant exchange, from just after its end-of-turn token."""
        full = [*_CONTEXT, *messages]
        ids, mask = self._encode_segments([m.get("role") for m in full], self._segments(full, add_generation_prompt),
                                          add_generation_prompt)
        context = self._context_ids
        if ids[:len(context)] != context:
            raise ValueError(f"the chat template of {self.path} renders a conversation's first turns differently "
                             "once more turns follow; spa_jax cannot extend it turn by turn: use another tokenizer")
        return ids[len(context):], mask[len(context):]

    @functools.cached_property
    def _context_ids(self) -> list[int]:
        return self.encode_chat(_CONTEXT)[0]

    def _check_against_template(self) -> None:
        reference = self._hf.apply_chat_template(list(_PROBE), add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"]
        ids, _ = self.encode_chat(_PROBE, add_generation_prompt=True)
        if ids != reference:
            raise ValueError(f"the chat template of {self.path} joins message contents to the text around them "
                             "in a way that tokenizes differently when encoded turn by turn; spa_jax cannot "
                             "encode it incrementally: use another tokenizer")

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
        """Token ids that open a turn of `role` (before its content)."""
        return [self._role_ids[role]] + self.encode("\n")

    def encode_chat(
        self, messages: Sequence[Message], add_generation_prompt: bool = False
    ) -> tuple[list[int], list[int]]:
        ids, mask = self.encode_turn_suffix(messages, add_generation_prompt)
        return [self.bos_id] + ids, [0] + mask

    def encode_turn_suffix(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> tuple[list[int], list[int]]:
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
