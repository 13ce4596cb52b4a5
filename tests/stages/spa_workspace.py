"""A tiny workspace for the prm / label / ppo stage tests, built once per test session.

policies/sft is a random-init micro policy (no SFT run); trajectories/explore holds ScriptedExpert
episodes and damaged copies of them, so final rewards vary (1 for a purchase, 0 otherwise):

  rollout 0: the expert's whole episode (a purchase);
  rollout 1: its first action only (a one-step trajectory, no purchase);
  rollout 2: an unparsable output, a click on a missing button, then the expert's actions up to
             (not including) the purchase (two ungrounded steps, no purchase).
The records carry no token ids (as with history elision), so the stages re-encode them.
"""

import shutil

from conftest import MICRO, apply
from spa_jax import configuration
from spa_jax.rollout import agent_format as af
from spa_jax.rollout.trajectory_store import TrajectoryWriter
from spa_jax.stages import common, prm
from spa_jax.digests import DigestCache
from spa_jax.workspace import Workspace

NUM_TASKS = 4
SETTINGS = MICRO | {
    "env.max_steps": 10, "prm.batch_size": 4, "prm.micro_batch_size": 2, "prm.epochs": 2,
    "prm.learning_rate": 1e-4, "prm.holdout_fraction": 0.25, "prm.validation_fraction": 0.0, "prm.checkpoint_every": 2,
    "prm.length_bucket": 1024, "ppo.length_bucket": 1024,
    "ppo.iterations": 2, "ppo.rollouts_per_iteration": 2, "ppo.mini_batch_size": 2, "ppo.grad_accum": 1,
    "ppo.ppo_epochs": 1, "ppo.max_new_tokens": 16, "ppo.reward_modes": "spa", "eval.policies": "sft,ppo_spa",
}


def make_config(root, overrides: dict | None = None):
  cfg = configuration.load_config("ppo")
  cfg.workspace = str(root)
  return configuration.validate(apply(cfg, {**SETTINGS, **(overrides or {})}))


def _record(task_id, rollout, steps, final_reward, termination):
  return {"task_id": task_id, "rollout": rollout, "policy": "synthetic", "instruction": "", "steps": steps,
          "num_steps": len(steps), "final_reward": final_reward, "purchased": termination == "purchase",
          "success": final_reward >= 1.0, "termination": termination, "reward_info": None, "env": {},
          "one_shot": False, "history_window": 0, "tokens": None, "action_mask": None}


def _step(observation, output, valid):
  action, error = af.parse_action(output)
  return {"observation": observation, "model_output": output, "parsed_action": action, "parse_error": error,
          "valid": valid, "reward": 0.0, "token_logprobs": [], "finish_reason": "stop"}


def expert_records(cfg) -> list[dict]:
  from webshop import ScriptedExpert, WebShopEnv
  from webshop.expert import run_expert_episode
  catalogue = common.load_catalogue(cfg)
  env = WebShopEnv(catalogue, **common.env_kwargs(cfg))
  expert = ScriptedExpert(catalogue)
  records = []
  for task in common.split_tasks(cfg, cfg.env.train_split, NUM_TASKS):
    played = run_expert_episode(env, task, expert)
    steps = [_step(af.observation_message(s.observation), s.response, bool(s.info.get("valid", True)))
             for s in played]
    records.append(_record(task, 0, steps, float(played[-1].reward), "purchase"))
    records.append(_record(task, 1, steps[:1], 0.0, "max_steps"))
    damaged = [_step(steps[0]["observation"], "I will look around.", False),
               _step(af.INVALID_FORMAT_MESSAGE, "Thought: go.\nAction: click[nothing here]", False)]
    damaged += steps[:-1]  # the failed click leaves the first page on screen
    records.append(_record(task, 2, damaged, 0.0, "max_steps"))
  return records


def build(root) -> None:
  """Random SFT policy, synthetic exploration data, and a trained estimator (prm stage) in `root`."""
  cfg = make_config(root)
  ws = Workspace(root)
  tokenizer = common.load_tokenizer(cfg, ws)
  mesh = common.make_mesh(cfg)
  model_cfg, model = common.init_policy(cfg, tokenizer, mesh)
  common.save_policy(ws, "sft", model, model_cfg)
  with TrajectoryWriter(ws, prm.EXPLORE) as write:
    for record in expert_records(cfg):
      write(record)
  summary = prm.run(cfg, ws)
  ws.mark_done("prm", "test", {}, summary, DigestCache())


def workspace_copy(tmp_path_factory, tmp_path):
  """A fresh copy of the session's built workspace (built on first use)."""
  base = tmp_path_factory.getbasetemp() / "spa_base"
  if not (base / "prm" / "DONE.json").exists():
    shutil.rmtree(base, ignore_errors=True)
    build(base)
  root = tmp_path / "ws"
  shutil.copytree(base, root)
  return root
