"""Next-token choice from logits: greedy, temperature and nucleus (top-p), all per row as arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def top_p_filter(logits_bv: jax.Array, top_p_b: jax.Array) -> jax.Array:
    """Logits with every token outside each row's nucleus set to -inf.

    The nucleus is the smallest set of most likely tokens whose probability reaches top_p (the most
    likely token is always kept; ties at the threshold stay). Rows with top_p >= 1 are unchanged."""
    sorted_bv = jnp.sort(logits_bv, axis=-1)[:, ::-1]
    probs_bv = jax.nn.softmax(sorted_bv, axis=-1)
    mass_before_bv = jnp.cumsum(probs_bv, axis=-1) - probs_bv
    kept_b = jnp.sum(mass_before_bv < top_p_b[:, None], axis=-1)
    threshold_b = jnp.take_along_axis(sorted_bv, jnp.maximum(kept_b - 1, 0)[:, None], axis=-1)[:, 0]
    filtered_bv = jnp.where(logits_bv < threshold_b[:, None], -jnp.inf, logits_bv)
    return jnp.where((top_p_b >= 1.0)[:, None], logits_bv, filtered_bv)


def sample_tokens(
    logits_bv: jax.Array, rng: jax.Array, temperature_b: jax.Array, top_p_b: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """(tokens_b, logprobs_b). Rows with temperature 0 take the argmax; others sample from
    softmax(logits / temperature) restricted to the top-p nucleus.

    logprobs_b is log softmax(logits)[token] of the unmodified (temperature 1, no top-p) policy,
    the log pi(token) that PPO's ratio needs, whatever temperature/top-p chose the token."""
    logits_bv = logits_bv.astype(jnp.float32)
    greedy_b = jnp.argmax(logits_bv, axis=-1).astype(jnp.int32)

    def sample(logits_bv):
        scaled_bv = logits_bv / jnp.maximum(temperature_b, 1e-6)[:, None]
        # Sorting the vocabulary is costly: only when some row asks for top-p.
        scaled_bv = jax.lax.cond(
            jnp.any(top_p_b < 1.0), lambda x: top_p_filter(x, top_p_b), lambda x: x, scaled_bv
        )
        sampled_b = jax.random.categorical(rng, scaled_bv, axis=-1).astype(jnp.int32)
        return jnp.where(temperature_b > 0, sampled_b, greedy_b)

    # All-greedy batches (evaluation) skip the random draw over the vocabulary.
    tokens_b = jax.lax.cond(jnp.any(temperature_b > 0), sample, lambda _: greedy_b, logits_bv)
    logprobs_bv = jax.nn.log_softmax(logits_bv, axis=-1)
    logprobs_b = jnp.take_along_axis(logprobs_bv, tokens_b[:, None], axis=-1)[:, 0]
    return tokens_b, logprobs_b
