"""HF safetensors I/O against PyTorch `transformers.LlamaForCausalLM` on tiny random models."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from spa_jax.models import apply_lora  # noqa: E402
from spa_jax.models.hf_io import INDEX_FILE, load_hf, save_hf  # noqa: E402

SEQ_LEN = 20  # > original_max_position_embeddings (8) of micro_cfg: exercises llama3 scaling


def _torch_model(cfg, dtype=torch.float32, seed=0):
  torch.manual_seed(seed)
  model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg.to_hf_dict()))
  return model.to(dtype).eval()


def _torch_logits(model, tokens_bt):
  with torch.no_grad():
    return model(torch.tensor(tokens_bt)).logits.float().numpy()


def _jax_logits(model, tokens_bt):
  graphdef, state = nnx.split(model)
  positions_bt = np.broadcast_to(np.arange(tokens_bt.shape[1]), tokens_bt.shape)
  forward = jax.jit(lambda s, t, p: nnx.merge(graphdef, s)(t, p)[0])
  return np.asarray(forward(state, jnp.asarray(tokens_bt), jnp.asarray(positions_bt)), np.float32)


def _tokens(cfg, batch=2, seed=0):
  return np.random.default_rng(seed).integers(0, cfg.vocab_size, (batch, SEQ_LEN))


def _safetensors(directory):
  index = directory / INDEX_FILE
  files = (
      sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists()
      else ["model.safetensors"]
  )
  tensors = {}
  for name in files:
    tensors.update(load_file(directory / name))
  return tensors


@pytest.fixture(params=[False, True], ids=["untied", "tied"])
def hf_dir(request, micro_cfg, tmp_path):
  cfg = micro_cfg.replace(tie_embeddings=request.param)
  torch_model = _torch_model(cfg)
  torch_model.save_pretrained(tmp_path / "hf")
  return cfg, torch_model, tmp_path / "hf"


def test_logits_match_pytorch(hf_dir):
  cfg, torch_model, directory = hf_dir
  loaded_cfg, model = load_hf(directory)
  assert loaded_cfg == cfg
  tokens_bt = _tokens(cfg)
  np.testing.assert_allclose(_jax_logits(model, tokens_bt), _torch_logits(torch_model, tokens_bt), atol=1e-4, rtol=1e-4)


def test_export_is_bit_exact_and_loads_in_transformers(hf_dir, tmp_path):
  cfg, torch_model, directory = hf_dir
  _, model = load_hf(directory)
  out = save_hf(model, cfg, tmp_path / "export")
  original, exported = _safetensors(directory), _safetensors(out)
  assert sorted(exported) == sorted(k for k in original if not (cfg.tie_embeddings and k == "lm_head.weight"))
  for key, value in exported.items():
    assert value.dtype == original[key].dtype and np.array_equal(value, original[key]), key
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  tokens_bt = _tokens(cfg, seed=1)
  np.testing.assert_allclose(_torch_logits(reloaded, tokens_bt), _jax_logits(model, tokens_bt), atol=1e-4, rtol=1e-4)


def test_bf16_round_trip_and_sharded_files(micro_cfg, tmp_path):
  cfg = micro_cfg.replace(param_dtype="bfloat16", dtype="bfloat16")
  _torch_model(cfg, dtype=torch.bfloat16).save_pretrained(tmp_path / "hf")
  loaded_cfg, model = load_hf(tmp_path / "hf")
  assert loaded_cfg.param_dtype == "bfloat16"
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(nnx.state(model)))
  out = save_hf(model, loaded_cfg, tmp_path / "sharded", max_shard_bytes=20_000)
  index = json.loads((out / INDEX_FILE).read_text())
  assert len(set(index["weight_map"].values())) > 2
  original, exported = _safetensors(tmp_path / "hf"), _safetensors(out)
  assert sorted(original) == sorted(exported)
  for key, value in exported.items():
    assert value.dtype == original[key].dtype and value.tobytes() == original[key].tobytes(), key
  _, reloaded = load_hf(out)
  for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(reloaded))):
    assert np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)], ids=["umask022", "umask077"])
def test_exported_files_follow_the_umask(micro_cfg, micro_model, tmp_path, umask, mode):
  previous = os.umask(umask)
  try:
    single = save_hf(micro_model, micro_cfg, tmp_path / "single")
    sharded = save_hf(micro_model, micro_cfg, tmp_path / "sharded", max_shard_bytes=20_000)
  finally:
    os.umask(previous)
  files = sorted(single.iterdir()) + sorted(sharded.iterdir())
  assert len(files) > 4 and any(f.suffix == ".safetensors" for f in files)
  assert {f.name: oct(f.stat().st_mode & 0o777) for f in files} == {f.name: oct(mode) for f in files}


def test_save_merges_lora(micro_cfg, micro_model, tmp_path):
  apply_lora(micro_model, rank=2, alpha=4, targets=("q_proj", "v_proj", "up_proj"), rngs=nnx.Rngs(1))
  lora = nnx.state(micro_model, nnx.LoRAParam)
  nnx.update(micro_model, jax.tree.map(lambda x: x + 0.1, lora))
  tokens_bt = _tokens(micro_cfg)
  with_adapters = _jax_logits(micro_model, tokens_bt)
  save_hf(micro_model, micro_cfg, tmp_path / "merged")
  assert len(jax.tree.leaves(nnx.state(micro_model, nnx.LoRAParam))) > 0  # caller's model untouched
  _, merged = load_hf(tmp_path / "merged")
  np.testing.assert_allclose(_jax_logits(merged, tokens_bt), with_adapters, atol=1e-5)


def test_missing_and_misshaped_tensors_are_named(micro_cfg, micro_model, tmp_path):
  out = save_hf(micro_model, micro_cfg, tmp_path / "ok")
  tensors = load_file(out / "model.safetensors")
  missing = dict(tensors)
  del missing["model.layers.1.mlp.up_proj.weight"]
  save_file(missing, out / "model.safetensors")
  with pytest.raises(KeyError, match=r"model\.layers\.1\.mlp\.up_proj\.weight.*\(96, 64\)"):
    load_hf(out)
  bad = dict(tensors, **{"model.norm.weight": np.ones((63,), np.float32)})
  save_file(bad, out / "model.safetensors")
  with pytest.raises(ValueError, match=r"model\.norm\.weight.*\(63,\), expected \(64,\)"):
    load_hf(out)
  save_file(tensors, out / "model.safetensors")
  with pytest.raises(ValueError, match="does not use"):
    load_hf(out, micro_cfg.replace(num_layers=1))


def test_truncated_or_damaged_files_are_named_with_the_fix(micro_cfg, micro_model, tmp_path):
  out = save_hf(micro_model, micro_cfg, tmp_path / "ok")
  weights, config = out / "model.safetensors", out / "config.json"
  intact = weights.read_bytes()
  for damaged in (intact[:len(intact) // 2], b"garbage"):
    weights.write_bytes(damaged)
    with pytest.raises(ValueError, match=rf"^{weights} is not a readable safetensors file .* rerun the stage"):
      load_hf(out)
  weights.write_bytes(intact)
  config.write_text(config.read_text()[:20])
  with pytest.raises(ValueError, match=rf"^{config} is not valid JSON .* truncated or damaged"):
    load_hf(out)


_RSS_PROBE = """
import re, sys
import jax
from flax import nnx
from spa_jax.models import Llama, LlamaConfig
from spa_jax.models.hf_io import load_hf
jax.numpy.zeros(1).block_until_ready()
cfg = LlamaConfig.from_hf_dict(__import__("json").load(open(sys.argv[1] + "/config.json")))
nnx.eval_shape(lambda: Llama(cfg, rngs=nnx.Rngs(0)))  # warm up tracing outside the measurement
peak_kib = lambda: int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
before = peak_kib()
_, model = load_hf(sys.argv[1])
jax.block_until_ready(nnx.state(model))
print((peak_kib() - before) * 1024)
"""


@pytest.mark.slow
def test_load_streams_without_a_second_host_copy(tmp_path):
  """Peak RSS growth while loading stays near one copy of the weights (CPU devices share host RAM)."""
  import subprocess
  import sys

  from spa_jax.models import Llama, LlamaConfig
  from spa_jax.models.hf_io import hf_key

  cfg = LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=2048, num_layers=8,
                    num_heads=8, num_kv_heads=4, head_dim=64)
  rng = np.random.default_rng(0)
  tensors = {}
  for path, variable in nnx.to_flat_state(nnx.state(nnx.eval_shape(lambda: Llama(cfg, rngs=nnx.Rngs(0))))):
    key, transposed = hf_key(path)
    shape = variable.get_value().shape
    tensors[key] = rng.standard_normal(shape[::-1] if transposed else shape, dtype=np.float32)
  (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
  save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
  checkpoint_bytes = sum(t.nbytes for t in tensors.values())
  del tensors
  result = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  peak_growth = int(result.stdout.split()[-1])
  assert checkpoint_bytes <= peak_growth < 1.5 * checkpoint_bytes, (peak_growth, checkpoint_bytes)
