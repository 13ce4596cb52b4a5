"""KVCache: layout and writes, and the compiled decode loop (no cache copies: updated in place)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spa_jax.models import KVCache

# With micro_cfg's 2 kv heads x head_dim 16 every cache dim differs, and a cache layer outsizes
# every weight matrix.
BATCH, MAX_LEN = 3, 200


def test_layout_and_writes_at_row_positions_drop_past_max_len(micro_cfg):
  cache = KVCache.init(micro_cfg, BATCH, MAX_LEN, jnp.float32)
  layer_shape = (BATCH, micro_cfg.num_kv_heads, MAX_LEN, micro_cfg.head_dim)
  assert len(cache.k) == len(cache.v) == micro_cfg.num_layers
  assert all(x.shape == layer_shape for x in cache.k + cache.v)
  assert KVCache.layer_shape(micro_cfg, BATCH, MAX_LEN) == layer_shape
  assert (cache.batch, cache.max_len) == (BATCH, MAX_LEN)

  positions_bt = jnp.array([[0, 1], [5, 6], [MAX_LEN - 1, MAX_LEN]])  # row 2's second write is dropped
  k_btkh = jax.random.normal(jax.random.key(0), (BATCH, 2, micro_cfg.num_kv_heads, micro_cfg.head_dim))
  written = cache.write_layer(1, positions_bt, k_btkh, -k_btkh)

  want_k = np.zeros((micro_cfg.num_layers, *layer_shape), np.float32)
  for b, t in np.ndindex(BATCH, 2):
    if positions_bt[b, t] < MAX_LEN:
      want_k[1, b, :, positions_bt[b, t]] = k_btkh[b, t]
  np.testing.assert_array_equal(np.stack(written.k), want_k)
  np.testing.assert_array_equal(np.stack(written.v), -want_k)


_ALIASING_OPCODES = ("parameter", "get-tuple-element", "bitcast", "tuple")


def _top_level_instructions(hlo_text: str) -> list[tuple[str, tuple[int, ...], str, str]]:
  """(opcode, dims, layout, called computation) of every array-valued instruction outside fusion
  bodies that gets a buffer of its own (not a parameter or a view of another buffer)."""
  fused = set(re.findall(r"calls=(%[\w.\-]+)", hlo_text))
  instructions, computation = [], None
  for line in hlo_text.splitlines():
    if not line.startswith(" "):
      head = re.match(r"(?:ENTRY )?(%[\w.\-]+) ", line)
      computation = head.group(1) if head else computation
      continue
    m = re.match(r"\s*(?:ROOT )?\S+ = \w+\[([\d,]*)\](\{[\d,]*\})? ([\w\-]+)\(", line)
    if computation in fused or not m or not m.group(1) or m.group(3) in _ALIASING_OPCODES:
      continue
    calls = re.search(r"calls=(%[\w.\-]+)", line)
    dims = tuple(int(d) for d in m.group(1).split(","))
    instructions.append((m.group(3), dims, m.group(2) or "", calls.group(1) if calls else ""))
  return instructions


def _root_opcodes(hlo_text: str) -> dict[str, str]:
  """Computation name -> opcode of its ROOT instruction."""
  roots, computation = {}, None
  for line in hlo_text.splitlines():
    head = re.match(r"(?:ENTRY )?(%[\w.\-]+) ", line)
    if head and not line.startswith(" "):
      computation = head.group(1)
    root = re.match(r"\s*ROOT \S+ = .*? ([\w\-]+)\(", line)
    if root and computation:
      roots[computation] = root.group(1)
  return roots


def test_compiled_decode_loop_reads_cache_as_stored_and_updates_it_in_place(micro_model, micro_cfg):
  """XLA CPU's optimised HLO of a donated 4-step decode loop (float32: CPU widens bf16 scatters).

  The only instructions with a buffer of a cache layer's size are the in-place scatters of each
  layer's k and v: attention reads its layer as stored. A transposed or re-laid-out layer copy
  (which a [.., max_len, kv_heads, ..] layout needs) or a slice copied out of a stacked
  [layers, ...] cache (which the earlier layout needed in every layer and step) fails this."""
  graphdef, params = nnx.split(micro_model)
  cache = KVCache.init(micro_cfg, BATCH, MAX_LEN, jnp.float32)
  layer_shape = cache.k[0].shape

  def decode_loop(params, cache, tokens_b, positions_b):
    model = nnx.merge(graphdef, params)

    def step(i, carry):
      cache, tokens_b = carry
      logits_b1v, _, cache = model(tokens_b[:, None], (positions_b + i)[:, None], cache=cache)
      return cache, jnp.argmax(logits_b1v[:, 0], axis=-1).astype(jnp.int32)

    return jax.lax.fori_loop(0, 4, step, (cache, tokens_b))

  start_b = jnp.zeros(BATCH, jnp.int32)
  compiled = jax.jit(decode_loop, donate_argnums=1).lower(params, cache, start_b, start_b).compile()
  text = compiled.as_text()
  roots = _root_opcodes(text)
  default_layout = lambda dims: "{" + ",".join(map(str, reversed(range(len(dims))))) + "}"  # noqa: E731

  big = [i for i in _top_level_instructions(text) if np.prod(i[1]) >= np.prod(layer_shape)]
  scatters = [i for i in big if i[0] == "scatter" or roots.get(i[3]) == "scatter"]
  assert len(scatters) == 2 * micro_cfg.num_layers, big  # k and v of each layer, once per step
  assert all(i[1] == layer_shape for i in scatters), scatters
  assert all(i[2] in ("", default_layout(i[1])) for i in big), big  # no re-laid-out copy
  assert not [i for i in big if i not in scatters], big  # no copy of a layer at all
  stats = compiled.memory_analysis()
  assert stats.alias_size_in_bytes >= cache.nbytes  # result cache = donated buffers
