"""Step-level PPO with step rewards from the frozen progress estimator; spa-rl.md §2.7, §4, §7.5.

The default command's config: the whole chain, then the eval table of SFT, sparse PPO and SPA.

Real presets (llama3.2-1b / 3b / 3.1-8b / 3b-tpu) take the released PPO hyper-parameters
(spa-rl.md §4): LoRA r 8, alpha 16 on q_proj, v_proj (config.model.lora); Adam LR 1e-5 constant;
32 trajectories per PPO step, mini-batch 2 x grad_accum 4 (8 trajectories per optimizer update);
4 PPO epochs; gamma 0.99; lambda 0.95; clip 0.2; value clip 0.2; vf_coef 0.1; no entropy bonus;
skip a batch whose mean ratio exceeds 10; KL estimator "kl" with the adaptive controller (init
0.3, target 6, horizon 10,000); whitened advantages; context 4,096. Where we depart on purpose:
on-policy ("online") iterations by default (§7.5), the estimator's own c_t (§7.1), unscaled step
rewards (§7.3), a separate critic (released: a value head on the shared LoRA backbone), and 50
iterations (released: one offline epoch, about 49 PPO steps, over 1,596 trajectories).

The tiny preset is sized for the 20-minute CPU budget of the whole default command.
"""

import ml_collections
from ml_collections import config_dict

from spa_jax.configuration import load_sibling


def ppo_section(preset: str) -> ml_collections.ConfigDict:
  base = load_sibling(__file__, "base")
  real = base.is_real(preset) or preset == base.SMOLLM2  # smollm2-135m: the released values too
  cfg = ml_collections.ConfigDict(dict(
      # "online": each iteration samples fresh rollouts of the current policy, labels them with the
      # frozen estimator + env grounding, updates; "offline": PPO on the labelled held-out
      # exploration trajectories (label/labels.jsonl), as the released pipeline does.
      mode="online",
      finetune="lora",  # "lora" (policy LoRA, critic LoRA + head) | "full"
      # One PPO run per mode, each from the SFT policy, writing policy "ppo_<mode>":
      # "spa" (progress + grounding), "sparse" (final reward only), "grounding_only".
      reward_modes="sparse,spa",
      critic_init="sft",  # critic backbone: "sft" (policy) | "prm" (the estimator's); the head starts at 0
      # Iterations at the start that update only the critic (verl's trainer.critic_warmup; released
      # code: 0; the paper does not say). Its head starts at 0, so the first advantages are
      # returns-to-go: with spa's per-step rewards those favour early steps and penalise the last one.
      critic_warmup=0,
      iterations=50 if real else 2,  # rollout + update rounds
      rollouts_per_iteration=32 if real else 12,  # trajectories per PPO step (global)
      samples_per_task=1,  # episodes per train task in one iteration (online)
      mini_batch_size=2 if real else 6,  # trajectories per micro-batch
      grad_accum=4 if real else 1,  # micro-batches per optimizer update
      ppo_epochs=4 if real else 1,  # tiny: 1 keeps the default command inside 20 minutes on 2 cores
      learning_rate=1e-5 if real else 1e-3,
      critic_learning_rate=config_dict.placeholder(float),  # unset: learning_rate (released: one LR)
      # Policy optimizer updates over which its LR ramps linearly from 0 (released: 0, constant). Adam's
      # first steps move every LoRA weight by about the full LR whatever the gradient's size; at lr 1e-3
      # SmolLM2's first SPA update was destructive (bench/RESULTS.md, 2026-12-07 10:10).
      warmup_updates=0,
      grad_clip=1.0,
      gamma=0.99,
      gae_lambda=0.95,
      clip_ratio=0.2,
      value_clip=0.2,
      vf_coef=0.1,
      entropy_coef=0.0,
      max_mean_ratio=10.0,  # skip a batch whose mean ratio exceeds this
      # KL early stop (SB3's target_kl; released code: none): once a mini-batch's approx KL to the
      # iteration's sampling policy (mean 0.5 (log r)^2 per token, before its update) exceeds 1.5 x this,
      # the policy stops updating for the rest of the iteration (the critic goes on). Unset: off. Made
      # for the single iterations that moved SmolLM2's policy 0.2-0.5 nats per token (median 0.001-0.008)
      # in about 1 run in 4 at lr 3e-4 (bench/RESULTS.md, 2026-12-07 21:08).
      target_kl=config_dict.placeholder(float),
      whiten_advantages=True,
      kl=ml_collections.ConfigDict(dict(
          adaptive=True, init_coef=0.3 if real else 0.05, target=6.0, horizon=10000,
          estimator="kl",  # "kl" (log pi - log ref) | "k3"
      )),
      temperature=1.0,
      top_p=1.0,
      max_new_tokens=512 if real else 96,
      max_len=4096 if real else 2048,  # longer rollouts are left out of the update
      length_bucket=512,  # a batch is padded to a multiple of this (one compiled shape each)
      # Update mini-batches of trajectories of like length (ppo.epoch_mini_batches): less padding, but
      # a mini-batch is no longer a uniform sample of the iteration's trajectories. Off: uniform.
      group_by_length=False,
      # PPO's own seed (LoRA/critic-head init, task order, sampling, mini-batches); unset: config.seed.
      # Not in the upstream stages' fingerprints: PPO seeds can share one SFT policy and estimator.
      seed=config_dict.placeholder(int),
      # Seconds per reward mode (per invocation): past it, the run stops after the current iteration,
      # checkpoints and writes that policy; `run.force=ppo` goes on from there. Not fingerprinted.
      time_budget_s=config_dict.placeholder(float),
      # Held-out learning curve: every eval_every iterations (0: off), plus before the first and after
      # the last, greedy episodes of the current policy on the first eval_tasks goals of env.eval_split
      # (unset: eval.max_tasks) -> metrics/ppo_<mode>_eval.jsonl. Watches only: not fingerprinted.
      eval_every=0,
      eval_tasks=config_dict.placeholder(int),
      checkpoint_every=5 if real else 1,  # iterations between Orbax checkpoints (resume points)
      keep_checkpoints=2,
  ))
  if preset == base.SMOLLM2:
    cfg.max_new_tokens = 128  # as explore and eval: a ReAct reply is ~30-60 tokens
  return cfg


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
  cfg = load_sibling(__file__, "label").get_config(preset)
  cfg.run.targets = "ppo,eval"
  cfg.ppo = ppo_section(cfg.preset)
  cfg.eval = load_sibling(__file__, "eval").eval_section(cfg.preset)
  return cfg
