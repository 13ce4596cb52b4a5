"""Tokenizers: chat encoding against the HF chat template (Llama 3 and ChatML), the incremental-turn
invariant, masks, SentencePiece training cache and the factory."""

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
# A Llama 3.2 style template: a dated default system message (HFTokenizer replaces it by the above).
LLAMA32_TEMPLATE = (
    "{{- bos_token }}{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}"
    "{{- 'Today Date: ' + strftime_now('%d %b %Y') + '<|eot_id|>' }}"
    "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# SmolLM2-Instruct's ChatML template (as its GGUF carries it): a default system message, no trim.
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Llama 2's format: content right after "[INST] ", which a byte-level BPE merges with the space
# (when it has learnt " Observation" as a token: GLUED_CORPUS).
LLAMA2_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}"
    "{% endif %}{% endfor %}"
)
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                   "<|finetune_right_pad_id|>"]
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
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
GLUED_CORPUS = CORPUS + ["[INST] Observation: [INST] Observation: [INST] Observation:"]
CONVERSATION = [
    {"role": "system", "content": "You are web shopping."},
    {"role": "user", "content": "Observation:\nWebShop [SEP] Instruction: [SEP] red shoes [SEP] Search"},
    {"role": "assistant", "content": "Thought: I should search.\nAction: search[red shoes]"},
    {"role": "user", "content": "  Observation:\n[SEP] B000VOHH8I [SEP] Red Shoe [SEP] $12.00  \n"},
    {"role": "assistant", "content": "Thought: The first item matches. \nAction: click[B000VOHH8I]\n"},
    {"role": "user", "content": "Observation:\nYou have clicked B000VOHH8I."},
    {"role": "assistant", "content": "Thought: buy it\nAction: click[Buy Now]"},
]


def build_byte_bpe_tokenizer(path, specials, chat_template, bos_token, eos_token, corpus=CORPUS):
    """A small byte-level BPE with the Llama 3 split regex, the given special tokens and chat template."""
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
    from tokenizers import Tokenizer as RustTokenizer
    from transformers import PreTrainedTokenizerFast

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
    rust.train_from_iterator(corpus * 5, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=rust, bos_token=bos_token, eos_token=eos_token, chat_template=chat_template
    )
    hf.save_pretrained(str(path))
    return hf


FORMATS = {  # name -> (special tokens, chat template, bos, eos)
    "llama3": (LLAMA3_SPECIALS, LLAMA3_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>"),
    "chatml": (CHATML_SPECIALS, CHATML_TEMPLATE, "<|im_start|>", "<|im_end|>"),
}


@pytest.fixture(scope="module", params=sorted(FORMATS))
def hf_dir(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"{request.param}_tok")
    build_byte_bpe_tokenizer(path, *FORMATS[request.param])
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


def template_ids(hf_dir, messages, add_generation_prompt):
    """The chat template's ids of the messages, their content stripped (as our encoding does)."""
    from transformers import AutoTokenizer

    stripped = [{**message, "content": message["content"].strip()} for message in messages]
    return AutoTokenizer.from_pretrained(str(hf_dir)).apply_chat_template(
        stripped, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=True)["input_ids"]


@pytest.mark.parametrize("first", [0, 1])  # with and without a system message
@pytest.mark.parametrize("num_messages", [1, 2, 3, 5, 6])
def test_hf_encode_chat_matches_chat_template(hf_dir, hf_tok, first, num_messages):
    """With a generation prompt: the template's ids exactly. Without: up to the last end-of-turn (what
    ChatML writes after it, "\n", opens the next turn)."""
    messages = CONVERSATION[first:first + num_messages]
    prompted = template_ids(hf_dir, messages, add_generation_prompt=True)
    assert hf_tok.encode_chat(messages, add_generation_prompt=True)[0] == prompted
    closed = template_ids(hf_dir, messages, add_generation_prompt=False)
    ids, mask = hf_tok.encode_chat(messages)
    end = len(closed) - closed[::-1].index(hf_tok.end_of_turn_id)
    assert ids == closed[:end] and len(mask) == len(ids)
    assert hf_tok.decode(closed[end:]) == {"<|eot_id|>": "", "<|im_end|>": "\n"}[hf_tok.decode([hf_tok.end_of_turn_id])]


def test_hf_assistant_mask_is_each_reply_and_its_end_of_turn(hf_dir, hf_tok):
    """The mask, pinned on the template's text: the ids of each reply's content + the end-of-turn token."""
    ids, mask = hf_tok.encode_chat(CONVERSATION)
    expected = []
    for message in CONVERSATION:
        if message["role"] == "assistant":
            expected += hf_tok.encode(message["content"].strip()) + [hf_tok.end_of_turn_id]
    assert [t for t, m in zip(ids, mask) if m] == expected
    assert ids == template_ids(hf_dir, CONVERSATION, False)[:len(ids)]


def test_hf_special_ids(hf_dir, hf_tok):
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(str(hf_dir))
    if "<|eot_id|>" in ref.get_vocab():
        assert hf_tok.bos_id == ref.convert_tokens_to_ids("<|begin_of_text|>")
        assert hf_tok.end_of_turn_id == ref.convert_tokens_to_ids("<|eot_id|>")
        assert hf_tok.eos_id == ref.convert_tokens_to_ids("<|end_of_text|>")
        assert hf_tok.pad_id == ref.convert_tokens_to_ids("<|finetune_right_pad_id|>")
    else:
        assert hf_tok.bos_id == ref.convert_tokens_to_ids("<|im_start|>")
        assert hf_tok.end_of_turn_id == hf_tok.eos_id == ref.convert_tokens_to_ids("<|im_end|>")
        assert hf_tok.pad_id == hf_tok.eos_id  # no pad token of its own
    assert hf_tok.vocab_size == len(ref)


def test_llama3_tokenizer_uses_the_fastchat_template_not_its_dated_one(tmp_path):
    build_byte_bpe_tokenizer(tmp_path, LLAMA3_SPECIALS, LLAMA32_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>")
    tok = HFTokenizer(tmp_path)
    assert tok._hf.chat_template == tokenizer_lib.LLAMA3_CHAT_TEMPLATE
    assert "Today Date" not in tok.decode(tok.encode_chat(CONVERSATION[1:2], add_generation_prompt=True)[0])


@pytest.mark.parametrize("template, message", [
    (None, "has no chat template"),
    (LLAMA2_TEMPLATE, "tokenizes differently when encoded turn by turn"),
])
def test_hf_unusable_chat_template_is_rejected_naming_the_fix(tmp_path, template, message):
    build_byte_bpe_tokenizer(tmp_path, CHATML_SPECIALS, template, "<|im_start|>", "<|im_end|>", GLUED_CORPUS)
    with pytest.raises(ValueError, match=message) as error:
        HFTokenizer(tmp_path)
    assert "use " in str(error.value)


def test_encode_has_no_bos_and_round_trips(any_tok):
    text = "Thought: x  y\n\nAction: click[B000VOHH8I] 6.76 fl oz é"
    ids = any_tok.encode(text)
    assert any_tok.bos_id not in ids
    assert any_tok.decode(ids) == text


def test_assistant_mask_covers_exactly_assistant_content_and_end_of_turn(any_tok):
    ids, mask = any_tok.encode_chat(CONVERSATION)
    if any_tok.decode([any_tok.bos_id]) != "<|im_start|>":  # ChatML's "BOS" opens every turn
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


def test_encode_chats_equals_encode_chat_of_each_conversation(any_tok):
    """The batched encoding (SFT data) of conversations with shared and distinct texts and role orders."""
    conversations = [CONVERSATION, CONVERSATION[:3], CONVERSATION[1:], [{"role": "user", "content": "only me"}]]
    assert any_tok.encode_chats(conversations) == [any_tok.encode_chat(c) for c in conversations]


@pytest.mark.parametrize("first", [0, 1])  # with and without a system message
def test_incremental_turns_concatenate_to_whole_conversation(any_tok, first):
    """Opening prompt + (reply + next user turn + header)* == encode_chat of the whole conversation,
    and each prefix ending in a generation prompt == encode_chat of that prefix."""
    conversation = CONVERSATION[first:]
    opening = 2 - first
    ids, mask = any_tok.encode_chat(conversation[:opening], add_generation_prompt=True)
    for index in range(opening, len(conversation), 2):
        reply_ids, reply_mask = any_tok.encode_assistant_reply(conversation[index]["content"])
        ids, mask = ids + reply_ids, mask + reply_mask
        following = conversation[index + 1 : index + 2]
        if following:
            suffix_ids, suffix_mask = any_tok.encode_turn_suffix(following, add_generation_prompt=True)
            ids, mask = ids + suffix_ids, mask + suffix_mask
            assert (ids, mask) == any_tok.encode_chat(conversation[:index + 2], add_generation_prompt=True)
    assert (ids, mask) == any_tok.encode_chat(conversation)


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
