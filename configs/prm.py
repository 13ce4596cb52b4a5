"""Progress estimator training on exploration trajectories; spa-rl.md §2.4, §4 and §7.6.

Real presets follow the released estimator (§4): full backbone from the SFT policy, 1 epoch,
global batch 16, Adam LR 3e-6 with a 500-step linear warmup, weight decay 0.01, clip 1.0, bf16,
sequences up to 4,096 tokens. The head is a hidden-state `ScalarHead`, not the released
Linear(vocab, 1) on logits (§7.13). The tiny preset trains faster (LR 1e-4) on little data.
Unlike the released code, the head starts from a linear probe of the SFT backbone (`head_init`), not
from zero (bench/RESULTS.md, "a linear-probe head against a zero head"), and the stage keeps the
epoch (the probe included) that fits validation tasks best (`validation_fraction`): full fine-tuning
can undo the probe (bench/RESULTS.md, "probed estimator, critic warm-up, 5 PPO seeds").
"""

import ml_collections

from spa_jax.configuration import load_sibling


def prm_section(preset: str) -> ml_collections.ConfigDict:
  base = load_sibling(__file__, "base")
  real = base.is_real(preset) or preset == base.SMOLLM2
  cfg = ml_collections.ConfigDict(dict(
      finetune="full",  # "full" | "lora" (LoRA adapters per model.lora, plus the head)
      # The scalar head before training: "probe" (ridge regression of the final rewards on the SFT
      # backbone's summed step features, penalty by task-grouped cross-validation; LP-FT) or "zero".
      # From zero, fine-tuning first learns only the mean reward per step, so a short run counts steps.
      head_init="probe",
      dtype="",  # activations: "" (model.dtype) | "bfloat16" | "float32"
      # 0 with head_init="probe": no fine-tuning, the probe is the estimator (validation kept the probe over
      # every fine-tuned epoch in the three SmolLM2 H100 runs of 2026-12-07; bench/smollm2_chain.sh)
      epochs=1 if real else 2,
      batch_size=16 if real else 8,  # trajectories per optimizer step (global)
      micro_batch_size=2 if real else 8,
      # tiny: 1e-4; at 1e-3 the first Adam steps move the small backbone far enough to undo the probed head
      learning_rate=3e-6 if real else 1e-4,
      warmup_steps=500 if real else 2,  # linear warmup, then constant
      weight_decay=0.01,
      grad_clip=1.0,
      max_len=4096 if real else 2048,  # longer trajectories are left out (counted in the summary)
      length_bucket=512,  # batches are padded to a multiple of this (one compiled shape each)
      # Tasks held out (never trained on) to report estimator MSE / correlation out of sample; the
      # label stage labels only these trajectories for offline PPO.
      holdout_fraction=0.1 if real else 0.25,
      # Of the other tasks, those kept apart to choose the estimator: the stage ships the one with the
      # lowest MSE on them among the initial head (epoch 0) and every epoch's end. 0: the last epoch's.
      validation_fraction=0.1 if real else 0.2,
      checkpoint_every=200 if real else 10,  # optimizer steps between Orbax checkpoints
      keep_checkpoints=2,
      plot_examples=4,  # held-out trajectories in plots/prm_progress.png
  ))
  if preset == base.SMOLLM2:  # ~1k exploration trajectories: ~60 steps, so a short warm-up
    cfg.update(dict(learning_rate=1e-5, warmup_steps=10))
  return cfg


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
  cfg = load_sibling(__file__, "explore").get_config(preset)
  cfg.run.targets = "prm"
  cfg.prm = prm_section(cfg.preset)
  return cfg
