"""Sampler: persistent per-row KV cache across turns vs a full forward, log-probs, sampling modes,
stop sequences, context limit, row reset and no recompilation.

One module-wide sampler (batch 3, max_len 96, one length bucket, max_new_tokens <= 8) keeps the
number of XLA compilations, the dominant cost on CPU, at three."""

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spa_jax.models import llama
from spa_jax.models.config import LlamaConfig
from spa_jax.models.decode_attention import ragged_cached_attention
from spa_jax.models.llama import Llama
from spa_jax.models.tokenizer import SentencePieceTokenizer
from spa_jax.rollout.generate import Sampler
from spa_jax.rollout.stop import REACT_ACTION_LINE, StopSequence, build_stop_table

BATCH, MAX_LEN, MAX_NEW = 3, 96, 8
CORPUS = [
    "You are web shopping.\nI will give you instructions about what to do.\n",
    "Thought: I think I should search for red running shoes.\nAction: search[red running shoes]\n",
    "Observation:\nWebShop [SEP] Instruction: [SEP] i need a long lasting 6.76 fl oz bottle [SEP] Search\n",
    "Thought: The first item matches.\nAction: click[B000VOHH8I]\n\nThought: buy it\nAction: click[Buy Now]\n",
]
PROMPTS = ["hi", "Search red running shoes please, price lower than 40.00 dollars", "i need a bottle"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return SentencePieceTokenizer.train_or_load(CORPUS, tmp_path_factory.mktemp("spm"), vocab_size=400)


@pytest.fixture(scope="module")
def model_parts(tok):
    cfg = LlamaConfig(
        vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10_000.0,
    )
    graphdef, params = nnx.split(Llama(cfg, rngs=nnx.Rngs(0)))
    # Larger weights than the 0.02 init make the random model's greedy outputs vary from token to token.
    params = jax.tree.map(lambda x: x * 8 if x.ndim == 2 else x, params)
    return cfg, graphdef, params


@pytest.fixture(scope="module")
def sampler(tok, model_parts):
    cfg, graphdef, _ = model_parts
    return Sampler(graphdef, cfg, tok, batch_size=BATCH, max_len=MAX_LEN, length_buckets=(32,))


@pytest.fixture(scope="module")
def params(model_parts):
    return model_parts[2]


@pytest.fixture(scope="module")
def reference_logprobs(model_parts):
    """log_softmax of a cache-free forward over right-padded [BATCH, MAX_LEN] token rows."""
    cfg, graphdef, params = model_parts

    @jax.jit
    def forward(tokens_bt):
        positions_bt = jnp.broadcast_to(jnp.arange(MAX_LEN), tokens_bt.shape)
        logits_btv, _, _ = nnx.merge(graphdef, params)(tokens_bt, positions_bt)
        return jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)

    def run(histories):
        tokens_bt = np.zeros((BATCH, MAX_LEN), np.int32)
        for b, history in enumerate(histories):
            tokens_bt[b, : len(history)] = history
        return np.asarray(forward(tokens_bt))

    return run


def prompt_ids(tok, contents):
    return [tok.encode_chat([{"role": "user", "content": c}], add_generation_prompt=True)[0] for c in contents]


def fresh_with_prompts(sampler, params, token_lists):
    state = sampler.init_state()
    return sampler.extend(params, state, range(len(token_lists)), token_lists)


def assert_greedy_continuations(reference_logprobs, histories, generated, logprobs):
    """Each generated token is the full forward's argmax after its history; log-probs match."""
    logprobs_btv = reference_logprobs([h + g for h, g in zip(histories, generated)])
    for b, (history, tokens) in enumerate(zip(histories, generated)):
        positions = np.arange(len(history) - 1, len(history) - 1 + len(tokens))
        np.testing.assert_array_equal(logprobs_btv[b, positions].argmax(-1), tokens)
        np.testing.assert_allclose(logprobs_btv[b, positions, tokens], logprobs[b], atol=2e-4)


def test_multi_turn_cache_matches_full_forward_and_reencoding(tok, sampler, params, reference_logprobs):
    """Three agent turns on the persistent cache: each reply equals greedy decoding by a cache-free
    forward over the whole history, and re-encoding the history from scratch gives the same reply."""
    histories = prompt_ids(tok, PROMPTS)
    state = fresh_with_prompts(sampler, params, histories)
    observations = [["Observation:\nyou clicked", "x", "Observation:\n[SEP] Search"], ["a", "6.76 fl oz bottle", "b c"]]
    for turn in range(3):
        if turn:
            suffixes = []
            for b, reason in enumerate(reply.finish_reasons):
                close = [] if reason == "eos" else [tok.end_of_turn_id]
                suffix, _ = tok.encode_turn_suffix([{"role": "user", "content": observations[turn - 1][b]}])
                suffixes.append(close + suffix)
            state = sampler.extend(params, state, range(BATCH), suffixes)
            histories = [h + s for h, s in zip(histories, suffixes)]
        state, reply = sampler.generate(params, state, [True] * BATCH, rng=jax.random.key(turn), max_new_tokens=MAX_NEW)
        assert all(reason in ("eos", "length") for reason in reply.finish_reasons)
        assert [len(t) for t in reply.token_ids] == [len(lp) for lp in reply.logprobs]
        assert_greedy_continuations(reference_logprobs, histories, reply.token_ids, reply.logprobs)
        _, reencoded = sampler.generate(
            params, fresh_with_prompts(sampler, params, histories), [True] * BATCH,
            rng=jax.random.key(9), max_new_tokens=MAX_NEW,
        )
        assert reencoded.token_ids == reply.token_ids
        histories = [h + g for h, g in zip(histories, reply.token_ids)]
        np.testing.assert_array_equal(state.lengths, [len(h) for h in histories])


def test_sampled_tokens_lie_in_nucleus_and_logprobs_are_temperature_one(tok, sampler, params, reference_logprobs):
    histories = prompt_ids(tok, PROMPTS)
    temperature, top_p = 0.7, 0.9
    _, out = sampler.generate(
        params, fresh_with_prompts(sampler, params, histories), [True] * BATCH,
        rng=jax.random.key(1), max_new_tokens=MAX_NEW, temperature=temperature, top_p=top_p,
    )
    logprobs_btv = reference_logprobs([h + g for h, g in zip(histories, out.token_ids)])
    for b, (history, tokens) in enumerate(zip(histories, out.token_ids)):
        for i, token in enumerate(tokens):
            logp_v = logprobs_btv[b, len(history) - 1 + i]
            np.testing.assert_allclose(logp_v[token], out.logprobs[b][i], atol=2e-4)
            tempered_v = np.exp(logp_v / temperature - np.logaddexp.reduce(logp_v / temperature))
            order = np.argsort(-tempered_v)
            nucleus_size = int(np.searchsorted(np.cumsum(tempered_v[order]), top_p) + 1)
            assert token in order[: nucleus_size + 1]


def test_tiny_top_p_equals_greedy_and_rng_reproduces(tok, sampler, params):
    prompts = prompt_ids(tok, PROMPTS)
    run = lambda **kw: sampler.generate(  # noqa: E731
        params, fresh_with_prompts(sampler, params, prompts), [True] * BATCH, max_new_tokens=MAX_NEW, **kw
    )[1].token_ids
    greedy = run(rng=jax.random.key(0), temperature=0.0)
    assert run(rng=jax.random.key(5), temperature=1.0, top_p=1e-6) == greedy
    assert run(rng=jax.random.key(3), temperature=1.0) == run(rng=jax.random.key(3), temperature=1.0)
    samples = {str(run(rng=jax.random.key(seed), temperature=1.5)) for seed in range(3)}
    assert len(samples) > 1
    mixed = run(rng=jax.random.key(3), temperature=[0.0, 1.0, 0.0], top_p=[1.0, 1e-6, 0.5])
    assert mixed == greedy


def test_stop_sequence_stops_at_first_completion_and_trims_text(tok, sampler, params):
    prompts = prompt_ids(tok, PROMPTS)
    _, free = sampler.generate(
        params, fresh_with_prompts(sampler, params, prompts), [True] * BATCH,
        rng=jax.random.key(0), max_new_tokens=MAX_NEW,
    )
    texts = tok.token_texts()
    row = max(range(BATCH), key=lambda b: len(free.texts[b]))
    text = "".join(texts[t] for t in free.token_ids[row])
    assert len(text) >= 4, f"random model produced too little text to test stops: {text!r}"
    for stop in (StopSequence((text[1:3],)), StopSequence((text[1:2], text[-1]))):
        prefix_text = lambda n: "".join(texts[t] for t in free.token_ids[row][:n])  # noqa: E731
        stop_at = next(n for n in range(1, len(text) + 1) if stop.trim(prefix_text(n))[1])
        _, out = sampler.generate(
            params, fresh_with_prompts(sampler, params, prompts), [True] * BATCH,
            rng=jax.random.key(0), max_new_tokens=MAX_NEW, stop=stop,
        )
        assert out.finish_reasons[row] == "stop"
        assert out.token_ids[row] == free.token_ids[row][:stop_at]
        expected_text, found = stop.trim(tok.decode(out.token_ids[row]))
        assert found and out.texts[row] == expected_text
        assert len(out.texts[row]) < len(tok.decode(out.token_ids[row]))


def test_react_stop_table_agrees_with_text_search():
    texts = ["Act", "ion", ":", " x", "\n", "Action: y]\n", "A", "ActAction:", "z\nq", "Acti", "on:\n", "", "é"]
    table_vs = build_stop_table(REACT_ACTION_LINE, texts, len(texts) + 2)
    fired = table_vs.shape[1] - 1
    rng = random.Random(0)
    for _ in range(3000):
        tokens = [rng.randrange(len(texts) + 2) for _ in range(rng.randrange(9))]
        state = 0
        for token in tokens:
            state = table_vs[token, state]
        text = "".join(texts[t] if t < len(texts) else "" for t in tokens)
        assert (state == fired) == REACT_ACTION_LINE.trim(text)[1], text
    trimmed = REACT_ACTION_LINE.trim("Thought: a\nAction: click[x]\nThought: more")
    assert trimmed == ("Thought: a\nAction: click[x]", True)


def test_context_limit_ends_rows_and_extend_refuses_overflow(tok, sampler, params):
    filler = tok.encode("Thought: I think I should search for red running shoes.\n" * 8)
    long_prompt = filler[: MAX_LEN - 3]
    state = fresh_with_prompts(sampler, params, [long_prompt, prompt_ids(tok, ["hi"])[0]])
    assert sampler.overflowing_rows(state, [0, 1], [[1, 2, 3], [1, 2, 3]]) == [0]
    with pytest.raises(ValueError, match="exceed max_len"):
        sampler.extend(params, state, [0], [[5, 5, 5, 5]])
    state, out = sampler.generate(params, state, [True, False, False], rng=jax.random.key(0), max_new_tokens=MAX_NEW)
    if out.finish_reasons[0] != "eos":
        assert out.finish_reasons[0] == "context_limit"
        assert len(out.token_ids[0]) == 3 and state.lengths[0] == MAX_LEN
        state, out = sampler.generate(
            params, state, [True, False, False], rng=jax.random.key(0), max_new_tokens=MAX_NEW
        )
        assert out.finish_reasons[0] == "context_limit" and out.token_ids[0] == []
    assert out.finish_reasons[1:] == ["", ""] and out.token_ids[1:] == [[], []]


def test_reset_and_inactive_rows(tok, sampler, params, reference_logprobs):
    prompts = prompt_ids(tok, PROMPTS)
    state = fresh_with_prompts(sampler, params, prompts)
    state, first = sampler.generate(params, state, [True, False, True], rng=jax.random.key(0), max_new_tokens=MAX_NEW)
    assert first.token_ids[1] == [] and state.lengths[1] == len(prompts[1])
    # Row 0 starts a new episode in place of the old one; row 1 generates only now.
    state = sampler.reset_rows(state, [0])
    new_prompt = prompt_ids(tok, ["Search red running shoes please"])[0]
    state = sampler.extend(params, state, [0], [new_prompt])
    state, second = sampler.generate(params, state, [True, True, False], rng=jax.random.key(0), max_new_tokens=MAX_NEW)
    assert_greedy_continuations(
        reference_logprobs, [new_prompt, prompts[1], prompts[2] + first.token_ids[2]],
        [second.token_ids[0], second.token_ids[1], []], [second.logprobs[0], second.logprobs[1], []],
    )
    with pytest.raises(ValueError, match="empty"):
        sampler.generate(
            params, sampler.reset_rows(state, [2]), [False, False, True], rng=jax.random.key(0), max_new_tokens=2
        )


def test_bad_arguments_are_rejected(tok, sampler, params):
    state = sampler.init_state()
    with pytest.raises(ValueError, match="distinct indices"):
        sampler.extend(params, state, [0, 0], [[1], [2]])
    with pytest.raises(ValueError, match="token ids must lie"):
        sampler.extend(params, state, [0], [[tok.vocab_size + 5]])
    with pytest.raises(ValueError, match="rows_mask must have shape"):
        sampler.generate(params, state, [True], rng=jax.random.key(0), max_new_tokens=2)


def test_no_recompilation_across_lengths_sampling_settings_and_stops(tok, sampler, params):
    prompts = prompt_ids(tok, PROMPTS)
    sampler.generate(params, fresh_with_prompts(sampler, params, prompts), [True] * BATCH,
                     rng=jax.random.key(0), max_new_tokens=MAX_NEW)  # warm-up
    compiles = []

    def count(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        settings = [(0.0, 1.0, None), (1.0, 0.8, REACT_ACTION_LINE), (0.5, 1.0, StopSequence(("ab",)))]
        for i, (temperature, top_p, stop) in enumerate(settings):
            state = fresh_with_prompts(sampler, params, [p[: len(p) - i] for p in prompts])
            state = sampler.extend(params, state, [1], [tok.encode("more text " * (i + 1))])
            sampler.generate(params, state, [True, i != 1, True], rng=jax.random.key(i),
                             max_new_tokens=MAX_NEW - i, temperature=temperature, top_p=top_p, stop=stop)
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
    assert compiles == []


@pytest.mark.slow
def test_sharded_sampler_matches_single_device(tmp_path):
    """On 4 virtual CPU devices (data=2, fsdp=2) the batch-sharded sampler gives the same tokens."""
    script = textwrap.dedent(
        f"""
        import jax, numpy as np
        from flax import nnx
        from spa_jax.models.config import LlamaConfig
        from spa_jax.models.llama import Llama
        from spa_jax.models.tokenizer import SentencePieceTokenizer
        from spa_jax.rollout.generate import Sampler
        from spa_jax.sharding import make_mesh, shard_model
        assert len(jax.devices()) == 4
        tok = SentencePieceTokenizer.train_or_load({CORPUS!r}, {str(tmp_path)!r}, vocab_size=400)
        cfg = LlamaConfig(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128, num_layers=2,
                          num_heads=4, num_kv_heads=2, head_dim=16)
        model = Llama(cfg, rngs=nnx.Rngs(0))
        nnx.update(model, jax.tree.map(lambda x: x * 8 if x.ndim == 2 else x, nnx.state(model)))
        prompts = [tok.encode(p) for p in {PROMPTS + ["x"]!r}]
        outputs = []
        for mesh in (None, make_mesh(data=2, fsdp=2)):
            if mesh is not None:
                shard_model(model, mesh)
            graphdef, params = nnx.split(model)
            sampler = Sampler(graphdef, cfg, tok, batch_size=4, max_len=48, length_buckets=(32,), mesh=mesh)
            state = sampler.extend(params, sampler.init_state(), range(4), prompts)
            state, out = sampler.generate(params, state, [True] * 4, rng=jax.random.key(0), max_new_tokens=6)
            if mesh is not None:
                assert len(state.cache.k[0].sharding.device_set) == 4
                assert state.cache.k[0].sharding.spec[0] == ("data", "fsdp")
            outputs.append(out.token_ids)
            # rows 1 and 3 from a shared prefix (the first 5 tokens of their prompts' common start)
            shared = sampler.prefill_prefix(params, prompts[1][:5])
            state = sampler.start_rows(sampler.init_state(), [1, 3], shared)
            state = sampler.extend(params, state, range(4), [prompts[0], prompts[1][5:], prompts[2], prompts[1][5:]])
            state, out = sampler.generate(params, state, [True] * 4, rng=jax.random.key(0), max_new_tokens=6)
            if mesh is not None:
                assert state.cache.k[0].sharding.spec[0] == ("data", "fsdp")
            outputs.append(out.token_ids)
        plain, prefixed, plain_sharded, prefixed_sharded = outputs
        assert plain == plain_sharded and prefixed == prefixed_sharded, outputs
        assert prefixed[:3] == plain[:3] and prefixed[3] == plain[1], outputs  # row 3 had row 1's prompt
        print("SHARDED_OK")
        """
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0")
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert "SHARDED_OK" in result.stdout, result.stderr[-4000:]


def test_a_shared_prefix_gives_the_tokens_and_logprobs_of_prefilling_each_row(tok, sampler, params, reference_logprobs):
    """Rows started from a once-prefilled prefix (then extended with their own rest) decode exactly as
    rows prefilled whole, greedy and sampled; a row prefilled whole beside them is unaffected."""
    prefix = tok.encode_chat([{"role": "user", "content": CORPUS[0]}, {"role": "assistant", "content": "OK"}])[0]
    rests = [tok.encode_turn_suffix([{"role": "user", "content": c}])[0] for c in PROMPTS]
    histories = [prefix + rest for rest in rests]
    shared = sampler.prefill_prefix(params, prefix)
    assert shared.tokens == tuple(prefix)

    def started():  # rows 0 and 2 from the prefix, row 1 prefilled whole
        state = sampler.start_rows(sampler.init_state(), [0, 2], shared)
        np.testing.assert_array_equal(state.lengths, [len(prefix), 0, len(prefix)])
        return sampler.extend(params, state, range(BATCH), [rests[0], histories[1], rests[2]])

    for temperature in (0.0, 1.0):
        whole = fresh_with_prompts(sampler, params, histories)
        _, expected = sampler.generate(params, whole, [True] * BATCH, rng=jax.random.key(5),
                                       max_new_tokens=MAX_NEW, temperature=temperature)
        state = started()
        np.testing.assert_array_equal(state.lengths, [len(h) for h in histories])
        _, got = sampler.generate(params, state, [True] * BATCH, rng=jax.random.key(5),
                                  max_new_tokens=MAX_NEW, temperature=temperature)
        assert got.token_ids == expected.token_ids
        for a, b in zip(got.logprobs, expected.logprobs):
            np.testing.assert_allclose(a, b, atol=1e-5)
    assert_greedy_continuations(reference_logprobs, histories, *_greedy(sampler, params, started()))
    with pytest.raises(ValueError, match="not empty; reset_rows them before start_rows"):
        sampler.start_rows(started(), [1], shared)
    assert sampler.prefill_prefix(params, prefix[:1]) is None


def _greedy(sampler, params, state):
    _, reply = sampler.generate(params, state, [True] * BATCH, rng=jax.random.key(0), max_new_tokens=MAX_NEW)
    return reply.token_ids, reply.logprobs


def test_ragged_decode_attention_samples_the_dense_reads_tokens_and_logprobs(tok, model_parts, sampler, params,
                                                                              reference_logprobs, monkeypatch):
    """A sampler whose extensions and decode steps read each row's filled slots only (the Pallas
    kernel, interpreted on CPU) gives the dense sampler's tokens and log-probs over two turns, greedy
    and sampled, with a row that ends early; its greedy tokens are the full forward's argmax."""
    cfg, _, _ = model_parts
    ragged_cfg = cfg.replace(decode_attention="ragged")
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: Llama(ragged_cfg, rngs=nnx.Rngs(0))))  # the model holds its cfg
    ragged = Sampler(graphdef, ragged_cfg, tok, batch_size=BATCH, max_len=MAX_LEN, length_buckets=(32,))
    traced = []  # chunk widths of the kernel's traces: one per layer of each compiled extension / decode loop
    monkeypatch.setattr(llama, "ragged_cached_attention",
                        lambda *args: traced.append(args[0].shape[1]) or ragged_cached_attention(*args))
    prompts = prompt_ids(tok, PROMPTS)
    observation = tok.encode_turn_suffix([{"role": "user", "content": "Observation: ok"}])[0]
    replies = {}
    for name, each in (("dense", sampler), ("ragged", ragged)):
        state = fresh_with_prompts(each, params, prompts)
        turns = []
        for turn, temperature in enumerate((0.0, 1.0)):
            state, out = each.generate(params, state, [True, turn == 0, True], rng=jax.random.key(turn),
                                       max_new_tokens=MAX_NEW, temperature=temperature)
            turns.append(out)
            state = each.extend(params, state, [0, 2], [observation, observation])
        replies[name] = turns
    assert sorted(traced) == [1] * cfg.num_layers + [32] * cfg.num_layers  # decode steps; 32-token chunks
    for dense, ragged_out in zip(replies["dense"], replies["ragged"]):
        assert ragged_out.token_ids == dense.token_ids and ragged_out.finish_reasons == dense.finish_reasons
        for a, b in zip(ragged_out.logprobs, dense.logprobs):
            np.testing.assert_allclose(a, b, atol=1e-5)
    first = replies["ragged"][0]
    assert_greedy_continuations(reference_logprobs, prompts, first.token_ids, first.logprobs)
    with pytest.raises(ValueError, match="multiple of 16 slots, got 90: set config.agent.max_context=96"):
        Sampler(graphdef, ragged_cfg, tok, batch_size=BATCH, max_len=90)
