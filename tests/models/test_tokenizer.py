"""Tokenizers: chat encoding against the HF chat template, the incremental-turn invariant, masks,
SentencePiece training cache and the factory."""

import pytest

from spa_jax.models import tokenizer as tokenizer_lib
from spa_jax.models.tokenizer import HFTokenizer, SentencePieceTokenizer, load_tokenizer

# The Llama 3 (8B-Instruct) chat template, as shipped in its tokenizer_config.json.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
LLAMA3_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CORPUS = [
    "You are web shopping.\nI will give you instructions about what to do.\n",
    "Thought: I think I should search for red running shoes.\nAction: search[red running shoes]\n",
    "Observation:\nWebShop [SEP] Instruction: [SEP] i need a long lasting 6.76 fl oz bottle, price lower "
    "than 100.00 dollars [SEP] Search\n",
    "Thought: The first item matches.\nAction: click[B000VOHH8I]\n\nThought: buy it\nAction: click[Buy Now]\n",
]
CONVERSATION = [
    {"role": "system", "content": "You are web shopping."},
    {"role": "user", "content": "Observation:\nWebShop [SEP] Instruction: [SEP] red shoes [SEP] Search"},
    {"role": "assistant", "content": "Thought: I should search.\nAction: search[red shoes]"},
    {"role": "user", "content": "  Observation:\n[SEP] B000VOHH8I [SEP] Red Shoe [SEP] $12.00  \n"},
    {"role": "assistant", "content": "Thought: The first item matches. \nAction: click[B000VOHH8I]\n"},
    {"role": "user", "content": "Observation:\nYou have clicked B000VOHH8I."},
    {"role": "assistant", "content": "Thought: buy it\nAction: click[Buy Now]"},
]


def build_llama3_style_tokenizer(path):
    """A small byte-level BPE with the Llama 3 special tokens, split regex and chat template."""
    from tokenizers import Regex, decoders, models, pre_tokenizers, processors, trainers
    from tokenizers import Tokenizer as RustTokenizer
    from transformers import PreTrainedTokenizerFast

    specials = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|finetune_right_pad_id|>",
    ]
    rust = RustTokenizer(models.BPE())
    rust.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    rust.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    rust.train_from_iterator(CORPUS * 5, trainer)
    rust.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)]
    )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=rust, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", chat_template=LLAMA3_TEMPLATE
    )
    hf.save_pretrained(str(path))
    return hf


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama3_tok")
    build_llama3_style_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def hf_tok(hf_dir):
    return HFTokenizer(hf_dir)


@pytest.fixture(scope="module")
def spm_tok(tmp_path_factory):
    return SentencePieceTokenizer.train_or_load(CORPUS, tmp_path_factory.mktemp("spm"), vocab_size=400)


@pytest.fixture(params=["hf", "spm"])
def any_tok(request, hf_tok, spm_tok):
    return {"hf": hf_tok, "spm": spm_tok}[request.param]


@pytest.mark.parametrize("num_messages", [1, 2, 3, 5, 7])
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_hf_encode_chat_matches_chat_template(hf_dir, hf_tok, num_messages, add_generation_prompt):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(hf_dir)).apply_chat_template(
        CONVERSATION[:num_messages], add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=True
    )["input_ids"]
    ids, mask = hf_tok.encode_chat(CONVERSATION[:num_messages], add_generation_prompt=add_generation_prompt)
    assert ids == reference
    assert len(mask) == len(ids)


def test_hf_special_ids(hf_dir, hf_tok):
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(str(hf_dir))
    assert hf_tok.bos_id == ref.convert_tokens_to_ids("<|begin_of_text|>")
    assert hf_tok.end_of_turn_id == ref.convert_tokens_to_ids("<|eot_id|>")
    assert hf_tok.eos_id == ref.convert_tokens_to_ids("<|end_of_text|>")
    assert hf_tok.pad_id == ref.convert_tokens_to_ids("<|finetune_right_pad_id|>")
    assert hf_tok.vocab_size == len(ref)


def test_encode_has_no_bos_and_round_trips(any_tok):
    text = "Thought: x  y\n\nAction: click[B000VOHH8I] 6.76 fl oz é"
    ids = any_tok.encode(text)
    assert any_tok.bos_id not in ids
    assert any_tok.decode(ids) == text


def test_assistant_mask_covers_exactly_assistant_content_and_end_of_turn(any_tok):
    ids, mask = any_tok.encode_chat(CONVERSATION)
    assert ids[0] == any_tok.bos_id and ids.count(any_tok.bos_id) == 1
    spans, current = [], []
    for token, m in zip(ids, mask):
        if m:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    replies = [m["content"].strip() for m in CONVERSATION if m["role"] == "assistant"]
    assert len(spans) == len(replies)
    for span, reply in zip(spans, replies):
        assert span[-1] == any_tok.end_of_turn_id
        assert any_tok.decode(span[:-1]) == reply


def test_incremental_turns_concatenate_to_whole_conversation(any_tok):
    """Opening prompt + (reply + next user turn + header)* == encode_chat of the whole conversation."""
    ids, mask = any_tok.encode_chat(CONVERSATION[:2], add_generation_prompt=True)
    for index in range(2, len(CONVERSATION), 2):
        reply_ids, reply_mask = any_tok.encode_assistant_reply(CONVERSATION[index]["content"])
        ids, mask = ids + reply_ids, mask + reply_mask
        following = CONVERSATION[index + 1 : index + 2]
        if following:
            suffix_ids, suffix_mask = any_tok.encode_turn_suffix(following, add_generation_prompt=True)
            ids, mask = ids + suffix_ids, mask + suffix_mask
    assert (ids, mask) == any_tok.encode_chat(CONVERSATION)


def test_bad_messages_raise_clear_errors(any_tok):
    with pytest.raises(ValueError, match="role must be one of"):
        any_tok.encode_chat([{"role": "tool", "content": "x"}])
    with pytest.raises(ValueError, match="content must be a str"):
        any_tok.encode_chat([{"role": "user", "content": None}])


def test_token_texts_mark_newlines(any_tok):
    texts = any_tok.token_texts()
    assert len(texts) == any_tok.vocab_size
    assert texts[any_tok.end_of_turn_id] in ("", "<|end|>")
    for token in any_tok.encode("a\nb"):
        assert texts[token] == any_tok.decode([token])
    assert any("\n" in texts[t] for t in any_tok.encode("Action: x\n"))


def test_spm_train_or_load_caches_by_corpus_and_settings(tmp_path, monkeypatch):
    first = SentencePieceTokenizer.train_or_load(CORPUS, tmp_path, vocab_size=400)
    assert first.pad_id == 0 and first.bos_id == 2 and first.eos_id == 3
    assert first.vocab_size <= 400

    def fail_training(*args, **kwargs):
        raise AssertionError("cached model was retrained")

    monkeypatch.setattr(tokenizer_lib, "_train_spm", fail_training)
    again = SentencePieceTokenizer.train_or_load(iter(CORPUS), tmp_path, vocab_size=400)
    assert again.path == first.path
    with pytest.raises(AssertionError, match="retrained"):
        SentencePieceTokenizer.train_or_load(CORPUS + ["new text"], tmp_path, vocab_size=400)
    with pytest.raises(AssertionError, match="retrained"):
        SentencePieceTokenizer.train_or_load(CORPUS, tmp_path, vocab_size=300)


def test_spm_training_is_deterministic(tmp_path, spm_tok):
    again = SentencePieceTokenizer.train_or_load(CORPUS, tmp_path, vocab_size=400)
    assert again.path != spm_tok.path and again.path.read_bytes() == spm_tok.path.read_bytes()


def test_spm_splits_digits_and_falls_back_to_bytes(spm_tok):
    pieces = [spm_tok.decode([t]) for t in spm_tok.encode("12345")]
    assert pieces == list("12345")
    assert spm_tok.decode(spm_tok.encode("漢字 ✓")) == "漢字 ✓"


def test_spm_atomic_symbols_are_one_token_each_beside_the_bpe_pieces(tmp_path, spm_tok):
    ids = ["B0A9WDRPUP", "B07R87L8PA"]
    tok = SentencePieceTokenizer.train_or_load(CORPUS, tmp_path, vocab_size=400, atomic_symbols=ids)
    assert tok.path != spm_tok.path  # the symbols are part of the cache key
    assert tok.vocab_size == spm_tok.vocab_size + len(ids)  # on top of the BPE pieces
    text = "Next > [SEP] B0A9WDRPUP [SEP]\nAction: click[B07R87L8PA]"
    pieces = [tok.decode([t]) for t in tok.encode(text)]
    assert "B0A9WDRPUP" in pieces and "B07R87L8PA" in pieces
    assert tok.decode(tok.encode(text)) == text
    assert "B0A9WDRPUP" not in [spm_tok.decode([t]) for t in spm_tok.encode(text)]


def test_spm_empty_corpus_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="corpus is empty"):
        SentencePieceTokenizer.train_or_load([], tmp_path)


def test_load_tokenizer_dispatches_on_path(hf_dir, spm_tok, tmp_path):
    assert isinstance(load_tokenizer(hf_dir), HFTokenizer)
    assert isinstance(load_tokenizer(f"hf:{hf_dir}"), HFTokenizer)
    assert isinstance(load_tokenizer(spm_tok.path), SentencePieceTokenizer)
    assert isinstance(load_tokenizer(f"spm:{spm_tok.path}"), SentencePieceTokenizer)
    with pytest.raises(ValueError, match="cannot load tokenizer"):
        load_tokenizer(tmp_path / "missing.bin")
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "missing.model")
