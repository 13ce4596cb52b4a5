"""bench/model_bench.py's decode measurement as its callers use it (model_bench itself, and the
ceilings of rollout_bench and ppo_bench): with its own random model, and with one model's params
shared by variants of its graph (decode attention)."""

import pathlib
import sys

import jax

from spa_jax.models import LlamaConfig
from spa_jax.sharding import make_mesh

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))
import model_bench  # noqa: E402


def test_decode_with_its_own_model_and_with_shared_params_generates_every_token():
  cfg = LlamaConfig.preset("tiny")
  mesh = make_mesh()
  own = model_bench.bench_decode(cfg, mesh, batch=2, prompt=16, new_tokens=4, bandwidth=1e9)
  params = model_bench.random_params(cfg, mesh)
  ragged = cfg.replace(decode_attention="ragged")
  assert jax.tree.structure(params) == jax.tree.structure(model_bench.random_params(ragged, mesh))
  shared = model_bench.bench_decode(ragged, mesh, batch=2, prompt=16, new_tokens=4, bandwidth=1e9, slots=32,
                                    params=params)
  assert own["generated"] == shared["generated"] == 2 * 4  # no row stops early (model_bench's end-token ids)
  assert (own["cache_slots"], shared["cache_slots"]) == (20, 32)
  assert (own["decode_attention"], shared["decode_attention"]) == ("dense", "ragged")
