"""SFT (behaviour cloning) on expert ReAct conversations; spa-rl.md §2.1 and §4."""

import ml_collections
from ml_collections import config_dict

from spa_jax.configuration import load_sibling


def sft_section(preset: str) -> ml_collections.ConfigDict:
  base = load_sibling(__file__, "base")
  real = base.is_real(preset)
  cfg = ml_collections.ConfigDict(dict(
      finetune="full",  # "full" | "lora"
      # "expert": ScriptedExpert episodes on sft.train_split; or a path to an ETO webshop_sft.json
      data="expert",
      expert_episodes=config_dict.placeholder(int),  # None: one per train task (tiny: 2,137 goals)
      # Share of the expert's episodes (drawn per goal) that show going back from a product that lacks a
      # value the instruction asks for, where the plain instruction query lists one first (about 40% of
      # the embedded goals): search, open it, say what it lacks, click[< Prev], open a good one. 0: the
      # expert never opens such a product, and a cloned policy never goes back (bench/RESULTS.md,
      # failure_modes, 2026-12-07).
      expert_recovery=0.0,
      # the goals of the expert demonstrations; unset: env.train_split, the goals exploration and PPO
      # roll out on. A part of it keeps RL on goals SFT has not seen, e.g. sft.train_split="train[:1000]"
      # with env.train_split="train[1000:]" (an SFT policy explores its own demonstrations' goals
      # near the reward's ceiling: bench/RESULTS.md, 2026-12-05)
      train_split=config_dict.placeholder(str),
      epochs=3 if real else 1,
      batch_size=16 if real else 4,  # sequences per optimizer step (global)
      micro_batch_size=2 if real else 4,
      learning_rate=2e-5 if real else 5e-3,  # tiny: from random weights, 535 steps
      schedule="cosine",
      warmup_ratio=0.03,
      weight_decay=0.0,
      max_len=4096 if real else 2048,
      length_bucket=256,  # sequences are padded to a multiple of this (one compiled step per padded length)
      # At most this many padded lengths, fitted to the data to pad least (multiples of length_bucket;
      # training.batch.fit_padded_lengths): fewer compilations, more padding. 0: every multiple that occurs.
      max_padded_lengths=0,
      # Weight of a language-model loss on the other tokens (prompt, observations) beside the
      # agent's; 0 is the paper's agent-only SFT (real presets). For the randomly initialised tiny
      # model it stands in for pretraining: observations repeat the instruction and product text
      # verbatim, which teaches the model to copy from its context. There are ~8 such tokens per
      # agent token, so 0.15 gives the agent's own tokens about 45% of the loss (0 and 0.05 score
      # lower, 0.5 lower too: bench/RESULTS.md "tiny SFT recipes", parts 3 and 6).
      context_loss_weight=0.0 if real else 0.15,
      checkpoint_every=200 if real else 10,  # optimizer steps between Orbax checkpoints (resume points)
      keep_checkpoints=2,
  ))
  if preset == base.SMOLLM2:
    # Full fine-tune of the 135M model on every train goal's demonstration (2 epochs, ~267 steps),
    # AdamW 1e-4 with warm-up + cosine, agent tokens only: the PyTorch peer's recipe
    # (../shared/bench/smol_peer.py). Its demonstrations are 1-2.5k tokens: ONE padded length fitted to
    # the longest (128-token multiples) compiles one step shape; on an H100 the cold SFT job took 63.5 s
    # against 71.7 s with 512-token buckets' two shapes, and beat the peer's 68.9 s in the same call
    # (bench/RESULTS.md, sft_peer_bench 2026-12-07 21:26): the compilation saved outweighs the padding.
    cfg.update(dict(epochs=2, batch_size=16, micro_batch_size=4, learning_rate=1e-4, warmup_ratio=0.05,
                    max_len=4096, length_bucket=128, max_padded_lengths=1, context_loss_weight=0.0,
                    checkpoint_every=100))
  return cfg


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
  cfg = load_sibling(__file__, "base").get_base_config(preset)
  cfg.run.targets = "sft"
  cfg.sft = sft_section(cfg.preset)
  return cfg
