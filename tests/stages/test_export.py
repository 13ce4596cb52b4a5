"""Export stage: the HF directory loads in transformers and acts exactly like the JAX policy."""

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax import nnx  # noqa: E402

from spa_jax.rollout import agent_format as af  # noqa: E402
from spa_jax.rollout.stop import REACT_ACTION_LINE  # noqa: E402
from spa_jax.stages import common, export  # noqa: E402
from spa_jax.workspace import Workspace  # noqa: E402

NEW_TOKENS = 12


def _first_prompt(cfg):
  from webshop import WebShopEnv
  env = WebShopEnv(common.load_catalogue(cfg), **common.env_kwargs(cfg))
  observation, _ = env.reset(common.split_tasks(cfg, cfg.env.eval_split, 1)[0])
  return list(af.start_conversation(observation, cfg.agent.one_shot).messages)


@pytest.mark.slow
def test_exported_policy_generates_the_same_greedy_tokens_in_transformers(micro_config):
  cfg = micro_config("export", {"export.policy": "sft"})
  ws = Workspace(cfg.workspace)
  tokenizer = common.load_tokenizer(cfg, ws)
  mesh = common.make_mesh(cfg)
  model_cfg, model = common.init_policy(cfg, tokenizer, mesh)
  common.save_policy(ws, "sft", model, model_cfg)

  summary = export.run(cfg, ws)

  out_dir = summary["out_dir"]
  messages = _first_prompt(cfg)
  prompt_ids, _ = tokenizer.encode_chat(messages, add_generation_prompt=True)
  hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out_dir)
  text = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  assert hf_tokenizer.encode(text, add_special_tokens=False) == prompt_ids
  reply = "Thought: I'll search.\nAction: search[red shoes 12 pack]"
  assert hf_tokenizer.encode(reply, add_special_tokens=False) == tokenizer.encode(reply)

  hf_model = transformers.AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
  with torch.no_grad():
    hf_ids = hf_model.generate(torch.tensor([prompt_ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                               eos_token_id=[tokenizer.eos_id, tokenizer.end_of_turn_id],
                               pad_token_id=tokenizer.pad_id)[0, len(prompt_ids):].tolist()

  graphdef, params = nnx.split(model)
  sampler = common.make_sampler(cfg, model_cfg, graphdef, tokenizer, mesh, batch_size=1)
  state = sampler.extend(params, sampler.init_state(), [0], [prompt_ids])
  _, generation = sampler.generate(params, state, np.ones(1, bool), rng=jax.random.key(0),
                                   max_new_tokens=NEW_TOKENS, temperature=0.0, stop=REACT_ACTION_LINE)
  assert generation.token_ids[0] == hf_ids[:len(generation.token_ids[0])]
  assert len(generation.token_ids[0]) == NEW_TOKENS or generation.finish_reasons[0] != "length"
