"""Batched generation over a fixed set of rows, each keeping its episode's KV cache across turns.

    sampler = Sampler(graphdef, cfg, tokenizer, batch_size=64, max_len=4096, mesh=mesh)
    state = sampler.init_state()
    state = sampler.extend(params, state, rows, prompt_token_lists)        # prefill
    state, out = sampler.generate(params, state, rows_mask, rng=key, max_new_tokens=512,
                                  temperature=1.0, stop=REACT_ACTION_LINE)  # one agent turn
    state = sampler.extend(params, state, rows, next_turn_token_lists)     # observation appended
    state = sampler.reset_rows(state, finished_rows)                       # refill with new episodes
    prefix = sampler.prefill_prefix(params, shared_prompt_ids)              # once per policy version
    state = sampler.start_rows(state, new_rows, prefix)                     # its keys/values copied in

Row bookkeeping: a row's sequence is every token extended or generated since its reset. The
newest token of each row is "pending": it is held in `pending_b` and written to the cache by the
next extend/decode step, which is also the step that needs its logits. So prefill never computes
vocabulary logits, and every decode step feeds exactly one token per row.

Shared prefix: every episode's prompt starts with the same tokens (instruction, "OK", the one-shot
demonstration: ~1.1k tokens with the real presets). `prefill_prefix` computes their keys/values once,
on one row of their own, and `start_rows` copies them into emptied rows, which then hold the prefix
as if they had been extended with it (the prefix's last token pending); only the rest is prefilled.

Shapes are static: the batch is `batch_size`, extensions are padded to `length_buckets` (longer
ones run in several chunks), decode writes into a [batch, bucket(max_new_tokens)] buffer inside one
`lax.while_loop`. Temperature, top-p, token limits and lengths are arrays, so changing them does
not recompile. Padding is parked at position `max_len`, where cache writes are dropped.

Extensions and decode steps attend over the cache as the model's `decode_attention` says: "dense"
reads all `max_len` slots of every row; "ragged" only each row's filled slots
(`spa_jax.models.decode_attention`), so a cache sized for the longest episode costs nothing while
the rows are short.

Multi-process: every process passes the same global rows/tokens (the arrays are assembled from
them by `make_array_from_callback`) and gets the same outputs back.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from spa_jax.models.config import LlamaConfig
from spa_jax.models.decode_attention import SLOT_MULTIPLE, kernel_blocks
from spa_jax.models.kv_cache import CACHE_LOGICAL_AXES, KVCache
from spa_jax.models.tokenizer import Tokenizer
from spa_jax.rollout.sampling import sample_tokens
from spa_jax.rollout.stop import STATE_PAD, StopSequence, build_stop_table
from spa_jax.sharding import constrain, logical_to_sharding

FINISH_REASONS = ("", "eos", "stop", "length", "context_limit")  # index = on-device reason code
_EOS, _STOP, _LENGTH, _CONTEXT = 1, 2, 3, 4
DEFAULT_LENGTH_BUCKETS = (32, 64, 128, 256, 512)


@dataclasses.dataclass(frozen=True)
class DecodeState:
    """Per-row decoding state. Device arrays are donated by the call that consumes the state."""

    cache: KVCache
    pending_b: jax.Array  # [batch] int32: each row's newest token, not yet written to the cache
    lengths: np.ndarray  # [batch] host int: tokens in each row's sequence (the cache holds lengths - 1)


@dataclasses.dataclass(frozen=True)
class Generation:
    """One decode call's result per row; rows that were not generating have empty entries and ""."""

    token_ids: list[list[int]]  # sampled tokens, including a final end-of-turn/EOS or stop token
    logprobs: list[list[float]]  # log softmax(logits)[token] at temperature 1 (see sample_tokens)
    texts: list[str]  # decoded reply without the end token; cut before the stop match
    finish_reasons: list[str]  # "eos" | "stop" | "length" | "context_limit" | "" (not generating)


@dataclasses.dataclass(frozen=True)
class SharedPrefix:
    """Keys/values of a token prefix that many rows start with, computed once (`Sampler.prefill_prefix`)."""

    tokens: tuple[int, ...]
    cache: KVCache  # one row; slots 0 .. len(tokens) - 2 written (the last token is left pending)


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class Sampler:
    """Prefill + decode for `batch_size` rows of at most `max_len` tokens each (see module doc)."""

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        cfg: LlamaConfig,
        tokenizer: Tokenizer,
        *,
        batch_size: int,
        max_len: int,
        length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
        mesh: jax.sharding.Mesh | None = None,
        cache_dtype=None,
    ):
        if tokenizer.vocab_size > cfg.vocab_size:
            raise ValueError(
                f"tokenizer vocabulary ({tokenizer.vocab_size}) exceeds the model's ({cfg.vocab_size}); "
                "build the model with vocab_size >= the tokenizer's"
            )
        if cfg.decode_attention == "ragged":
            kernel_blocks(max_len)  # ValueError naming the fix when its kernel cannot tile the cache
        buckets = sorted({min(int(b), max_len) for b in length_buckets})
        if batch_size < 1 or max_len < 2 or not buckets or buckets[0] < 1:
            raise ValueError(
                f"need batch_size >= 1, max_len >= 2 and positive length_buckets; got {batch_size}, {max_len}, "
                f"{tuple(length_buckets)}"
            )
        self.graphdef = graphdef
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_len = max_len
        self.length_buckets = tuple(buckets)
        self.mesh = mesh
        self.cache_dtype = cfg.compute_jnp_dtype if cache_dtype is None else jnp.dtype(cache_dtype)
        end_ids = {tokenizer.eos_id, tokenizer.end_of_turn_id}
        end_flags_v = np.zeros(cfg.vocab_size, bool)
        end_flags_v[sorted(end_ids)] = True
        self._end_flags_v = self._put(end_flags_v, (None,))
        self._stop_tables: dict[StopSequence | None, jax.Array] = {}
        self._extend_chunk = jax.jit(self._extend_chunk_fn, donate_argnums=(1, 2))
        self._decode = jax.jit(self._decode_fn, donate_argnums=(1, 2), static_argnames=("max_steps",))
        self._prefill_prefix = jax.jit(self._prefill_prefix_fn)
        self._start_rows = jax.jit(self._start_rows_fn, donate_argnums=(0, 1))

    # ------------------------------------------------------------------------------------------
    # Host API

    def init_state(self) -> DecodeState:
        """Every row empty."""
        shape = KVCache.layer_shape(self.cfg, self.batch_size, self.max_len)
        make_cache = lambda: KVCache.init(self.cfg, self.batch_size, self.max_len, self.cache_dtype)  # noqa: E731
        if self.mesh is None:
            cache = make_cache()
        else:
            sharding = logical_to_sharding(CACHE_LOGICAL_AXES, self.mesh, shape)
            layers = (sharding,) * self.cfg.num_layers
            cache = jax.jit(make_cache, out_shardings=KVCache(k=layers, v=layers))()
        pending_b = self._put(np.zeros(self.batch_size, np.int32), ("batch",))
        return DecodeState(cache=cache, pending_b=pending_b, lengths=np.zeros(self.batch_size, np.int64))

    def reset_rows(self, state: DecodeState, rows: Sequence[int]) -> DecodeState:
        """`rows` emptied for new episodes (host only: stale cache slots are never visible)."""
        lengths = state.lengths.copy()
        lengths[self._checked_rows(rows)] = 0
        return dataclasses.replace(state, lengths=lengths)

    def prefill_prefix(self, params: nnx.State, tokens: Sequence[int]) -> SharedPrefix | None:
        """The keys/values of `tokens` under `params`, for `start_rows` (None when there are fewer than 2
        tokens or they leave no room to generate)."""
        tokens = tuple(int(t) for t in tokens)
        if not 2 <= len(tokens) < self.max_len:
            return None
        # one compiled shape per power of two, at least the ragged kernel's smallest key block
        width = min(max(_next_power_of_two(len(tokens)), SLOT_MULTIPLE), self.max_len)
        tokens_1l = np.full((1, width), self.tokenizer.pad_id, np.int32)
        tokens_1l[0, : len(tokens)] = tokens
        with self._mesh_context():
            cache = self._prefill_prefix(params, self._put(tokens_1l, (None, None)), np.int32(len(tokens)))
        return SharedPrefix(tokens=tokens, cache=cache)

    def start_rows(self, state: DecodeState, rows: Sequence[int], prefix: SharedPrefix) -> DecodeState:
        """Empty `rows` holding `prefix`, as if extended with its tokens (the next extend continues it)."""
        rows = self._checked_rows(rows)
        if not rows:
            return state
        busy = [row for row in rows if state.lengths[row]]
        if busy:
            raise ValueError(f"rows {busy} are not empty; reset_rows them before start_rows")
        index_r = np.full(self.batch_size, self.batch_size, np.int32)  # out of range: dropped
        index_r[: len(rows)] = rows
        with self._mesh_context():
            cache, pending_b = self._start_rows(
                state.cache, state.pending_b, prefix.cache, self._put(index_r, (None,)), np.int32(prefix.tokens[-1])
            )
        lengths = state.lengths.copy()
        lengths[rows] = len(prefix.tokens)
        return DecodeState(cache=cache, pending_b=pending_b, lengths=lengths)

    def overflowing_rows(
        self, state: DecodeState, rows: Sequence[int], token_lists: Sequence[Sequence[int]], reserve: int = 1
    ) -> list[int]:
        """Rows among `rows` that cannot take their tokens plus `reserve` generated ones within max_len
        (their episodes end with reason "context_limit")."""
        return [
            row
            for row, tokens in zip(rows, token_lists, strict=True)
            if state.lengths[row] + len(tokens) + reserve > self.max_len
        ]

    def extend(
        self, params: nnx.State, state: DecodeState, rows: Sequence[int], token_lists: Sequence[Sequence[int]]
    ) -> DecodeState:
        """`token_lists[i]` appended to row `rows[i]` (other rows untouched), in padded chunks."""
        rows = self._checked_rows(rows)
        if len(rows) != len(token_lists):
            raise ValueError(f"extend got {len(rows)} rows but {len(token_lists)} token lists")
        token_lists = [np.asarray(tokens, np.int64).reshape(-1) for tokens in token_lists]
        for row, tokens in zip(rows, token_lists):
            if tokens.size and (tokens.min() < 0 or tokens.max() >= self.cfg.vocab_size):
                raise ValueError(f"row {row}: token ids must lie in [0, {self.cfg.vocab_size}), got {tokens.tolist()}")
        too_long = self.overflowing_rows(state, rows, token_lists, reserve=0)
        if too_long:
            raise ValueError(
                f"rows {too_long} would exceed max_len={self.max_len}; check sampler.overflowing_rows first and "
                "end those episodes with reason 'context_limit'"
            )
        lengths = state.lengths.copy()
        cache, pending_b = state.cache, state.pending_b
        chunk = self.length_buckets[-1]
        for start in range(0, max((t.size for t in token_lists), default=0), chunk):
            pieces = [tokens[start : start + chunk] for tokens in token_lists]
            width = self._bucket(max(p.size for p in pieces))
            tokens_bl = np.full((self.batch_size, width), self.tokenizer.pad_id, np.int32)
            counts_b = np.zeros(self.batch_size, np.int32)
            for row, piece in zip(rows, pieces):
                tokens_bl[row, : piece.size] = piece
                counts_b[row] = piece.size
            with self._mesh_context():
                cache, pending_b = self._extend_chunk(
                    params,
                    cache,
                    pending_b,
                    self._put(tokens_bl, ("batch", "length")),
                    self._put(counts_b, ("batch",)),
                    self._put(lengths.astype(np.int32), ("batch",)),
                )
            lengths += counts_b
        return DecodeState(cache=cache, pending_b=pending_b, lengths=lengths)

    def generate(
        self,
        params: nnx.State,
        state: DecodeState,
        rows_mask: Sequence[bool],
        *,
        rng: jax.Array,
        max_new_tokens: int,
        temperature: float | Sequence[float] = 0.0,
        top_p: float | Sequence[float] = 1.0,
        stop: StopSequence | None = None,
    ) -> tuple[DecodeState, Generation]:
        """Decode a reply for every row in `rows_mask`, continuing its cache; generated tokens stay in it.

        A row stops at EOS / end-of-turn ("eos"), when `stop` fires ("stop"), after max_new_tokens
        ("length") or when its sequence reaches max_len ("context_limit"). temperature 0 is greedy;
        temperature and top_p may be per-row sequences."""
        active_b = np.asarray(rows_mask, bool)
        if active_b.shape != (self.batch_size,):
            raise ValueError(f"rows_mask must have shape ({self.batch_size},), got {active_b.shape}")
        empty = np.flatnonzero(active_b & (state.lengths == 0)).tolist()
        if empty:
            raise ValueError(f"rows {empty} are empty; extend them with a prompt before generating")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        temperature_b = np.broadcast_to(np.asarray(temperature, np.float32), (self.batch_size,))
        top_p_b = np.broadcast_to(np.asarray(top_p, np.float32), (self.batch_size,))
        if (temperature_b < 0).any() or (top_p_b <= 0).any():
            raise ValueError(f"need temperature >= 0 and top_p > 0, got {temperature!r} and {top_p!r}")
        with self._mesh_context():
            cache, pending_b, tokens_bn, logprobs_bn, reasons_b, lengths_b = self._decode(
                params,
                state.cache,
                state.pending_b,
                self._put(state.lengths.astype(np.int32), ("batch",)),
                self._put(active_b, ("batch",)),
                self._put(np.full(self.batch_size, max_new_tokens, np.int32), ("batch",)),
                self._put(temperature_b, ("batch",)),
                self._put(top_p_b, ("batch",)),
                self._stop_table(stop),
                self._end_flags_v,
                rng,
                max_steps=_next_power_of_two(max_new_tokens),
            )
        tokens_bn, logprobs_bn, reasons_b, lengths_b = map(_to_host, (tokens_bn, logprobs_bn, reasons_b, lengths_b))
        counts_b = lengths_b - state.lengths
        token_ids = [tokens_bn[b, : counts_b[b]].tolist() for b in range(self.batch_size)]
        reasons = [FINISH_REASONS[r] for r in reasons_b]
        texts = [self._reply_text(ids, reason, stop) for ids, reason in zip(token_ids, reasons)]
        generation = Generation(
            token_ids=token_ids,
            logprobs=[logprobs_bn[b, : counts_b[b]].tolist() for b in range(self.batch_size)],
            texts=texts,
            finish_reasons=reasons,
        )
        return DecodeState(cache=cache, pending_b=pending_b, lengths=lengths_b.astype(np.int64)), generation

    # ------------------------------------------------------------------------------------------
    # Jitted bodies

    def _extend_chunk_fn(self, params, cache, pending_b, tokens_bl, counts_b, lengths_b):
        """Writes [pending] + tokens[:count-1] of each row; the chunk's last token becomes pending."""
        model = nnx.merge(self.graphdef, params)
        width = tokens_bl.shape[1]
        has_pending_b = lengths_b > 0
        shifted_bl = jnp.concatenate([pending_b[:, None], tokens_bl[:, :-1]], axis=1)
        write_bl = jnp.where(has_pending_b[:, None], shifted_bl, tokens_bl)
        write_len_b = counts_b - 1 + has_pending_b.astype(jnp.int32)
        offsets_l = jnp.arange(width, dtype=jnp.int32)
        start_b = jnp.maximum(lengths_b - 1, 0)
        positions_bl = jnp.where(offsets_l < write_len_b[:, None], start_b[:, None] + offsets_l, self.max_len)
        _, _, cache = model(write_bl, positions_bl, cache=cache, compute_logits=False)
        last_b = jnp.take_along_axis(tokens_bl, jnp.maximum(counts_b - 1, 0)[:, None], axis=1)[:, 0]
        pending_b = jnp.where(counts_b > 0, last_b, pending_b)
        return self._constrain_cache(cache), pending_b

    def _prefill_prefix_fn(self, params, tokens_1l, count):
        """A one-row cache of width tokens_1l.shape[1] holding the first count - 1 tokens' keys/values."""
        model = nnx.merge(self.graphdef, params)
        width = tokens_1l.shape[1]
        offsets_1l = jnp.arange(width, dtype=jnp.int32)[None]
        positions_1l = jnp.where(offsets_1l < count - 1, offsets_1l, width)  # the rest is parked (dropped)
        cache = KVCache.init(self.cfg, 1, width, self.cache_dtype)
        _, _, cache = model(tokens_1l, positions_1l, cache=cache, compute_logits=False)
        return cache

    def _start_rows_fn(self, cache, pending_b, prefix, index_r, last_token):
        """Copies the prefix's slots into rows index_r (entries >= batch are dropped); sets their pending token."""
        width = prefix.k[0].shape[2]

        def copy(layers, prefix_layers):
            return tuple(
                old.at[index_r, :, :width].set(
                    jnp.broadcast_to(new, (index_r.shape[0], *new.shape[1:])).astype(old.dtype), mode="drop"
                )
                for old, new in zip(layers, prefix_layers)
            )

        cache = KVCache(k=copy(cache.k, prefix.k), v=copy(cache.v, prefix.v))
        return self._constrain_cache(cache), pending_b.at[index_r].set(last_token, mode="drop")

    def _decode_fn(
        self, params, cache, pending_b, lengths_b, active_b, max_new_b, temperature_b, top_p_b,
        stop_table_vs, end_flags_v, rng, *, max_steps,
    ):
        """One fused while_loop: feed each running row's pending token, sample the next one."""
        model = nnx.merge(self.graphdef, params)
        batch = pending_b.shape[0]
        fired_state = stop_table_vs.shape[1] - 1
        full_b = lengths_b >= self.max_len

        def cond(carry):
            step, running_b = carry[0], carry[4]
            return (step < max_steps) & jnp.any(running_b)

        def body(carry):
            step, cache, pending_b, lengths_b, running_b, stop_state_b, reasons_b, tokens_bn, logprobs_bn = carry
            positions_b1 = jnp.where(running_b, lengths_b - 1, self.max_len)[:, None]
            logits_b1v, _, cache = model(pending_b[:, None], positions_b1, cache=cache)
            token_b, logprob_b = sample_tokens(logits_b1v[:, 0], jax.random.fold_in(rng, step), temperature_b, top_p_b)
            token_b = jnp.where(running_b, token_b, pending_b)
            tokens_bn = tokens_bn.at[:, step].set(jnp.where(running_b, token_b, self.tokenizer.pad_id))
            logprobs_bn = logprobs_bn.at[:, step].set(jnp.where(running_b, logprob_b, 0.0))
            lengths_b = lengths_b + running_b.astype(jnp.int32)
            stop_state_b = jnp.where(running_b, stop_table_vs[token_b, stop_state_b], stop_state_b)
            reason_b = jnp.select(
                [end_flags_v[token_b], stop_state_b == fired_state, step + 1 >= max_new_b, lengths_b >= self.max_len],
                [_EOS, _STOP, _LENGTH, _CONTEXT],
                0,
            ).astype(jnp.int32)
            reasons_b = jnp.where(running_b, reason_b, reasons_b)
            running_b = running_b & (reason_b == 0)
            cache = self._constrain_cache(cache)
            return step + 1, cache, token_b, lengths_b, running_b, stop_state_b, reasons_b, tokens_bn, logprobs_bn

        carry = (
            jnp.int32(0),
            cache,
            pending_b,
            lengths_b,
            active_b & ~full_b,
            jnp.zeros(batch, jnp.int32),
            jnp.where(active_b & full_b, _CONTEXT, 0).astype(jnp.int32),
            jnp.full((batch, max_steps), self.tokenizer.pad_id, jnp.int32),
            jnp.zeros((batch, max_steps), jnp.float32),
        )
        _, cache, pending_b, lengths_b, _, _, reasons_b, tokens_bn, logprobs_bn = jax.lax.while_loop(cond, body, carry)
        return cache, pending_b, tokens_bn, logprobs_bn, reasons_b, lengths_b

    # ------------------------------------------------------------------------------------------
    # Helpers

    def _reply_text(self, token_ids: list[int], reason: str, stop: StopSequence | None) -> str:
        reply = token_ids[:-1] if reason == "eos" else token_ids
        text = self.tokenizer.decode([t for t in reply if t < self.tokenizer.vocab_size])
        return stop.trim(text)[0] if reason == "stop" and stop is not None else text

    def _stop_table(self, stop: StopSequence | None) -> jax.Array:
        if stop not in self._stop_tables:
            if stop is None:  # never leaves state 0: never fires
                table_vs = np.zeros((self.cfg.vocab_size, STATE_PAD), np.int32)
            else:
                table_vs = build_stop_table(stop, self.tokenizer.token_texts(), self.cfg.vocab_size)
            self._stop_tables[stop] = self._put(table_vs, (None, None))
        return self._stop_tables[stop]

    def _bucket(self, length: int) -> int:
        return next(b for b in self.length_buckets if b >= length)

    def _checked_rows(self, rows: Sequence[int]) -> list[int]:
        rows = [int(r) for r in rows]
        if len(set(rows)) != len(rows) or any(not 0 <= r < self.batch_size for r in rows):
            raise ValueError(f"rows must be distinct indices in [0, {self.batch_size}), got {rows}")
        return rows

    def _mesh_context(self):
        return contextlib.nullcontext() if self.mesh is None else jax.set_mesh(self.mesh)

    def _put(self, array: np.ndarray, logical_axes: tuple[str | None, ...]) -> jax.Array:
        """A global device array from the same host array on every process."""
        if self.mesh is None:
            return jnp.asarray(array)
        sharding = logical_to_sharding(logical_axes, self.mesh, array.shape)
        return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])

    @staticmethod
    def _constrain_cache(cache: KVCache) -> KVCache:
        return jax.tree.map(lambda x: constrain(x, CACHE_LOGICAL_AXES), cache)


def _to_host(x: jax.Array) -> np.ndarray:
    return np.asarray(x if x.is_fully_addressable else multihost_utils.process_allgather(x, tiled=True))
