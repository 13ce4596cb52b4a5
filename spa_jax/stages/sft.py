"""SFT stage: behaviour cloning of ReAct demonstrations (spa-rl.md §2.1), resumable.

Data: ScriptedExpert episodes on the train split (`sft.data="expert"`), or an ETO/SPA-RL
`webshop_sft.json` FastChat file. Each conversation is one sequence; the loss covers the agent's
step turns (`build_sft_example(...).step_mask`), plus, with `sft.context_loss_weight > 0`, the other
tokens at that weight (a language-model loss that teaches a randomly initialised model to copy). Batches group examples of similar length
(length buckets); their order is a pure function of (seed, epoch), so a run restored from its
latest Orbax checkpoint (train state + step) continues exactly where it stopped. The step of every
padded length compiles before the first step (summary: time_compile_s), so none stalls the loop; the
demonstrations build in a thread while the devices start and the weights load (time_setup_s).
Writes: policies/sft/ (HF directory), checkpoints/sft/<config hash>/, metrics/sft.jsonl, plots/sft.png.
"""

import bisect
import concurrent.futures
import logging
import shutil
import time

import jax
import ml_collections
import numpy as np
from flax import nnx

from spa_jax import distributed, tracking
from spa_jax.models import Llama, apply_lora
from spa_jax.rollout import agent_format as af
from spa_jax.stages import common
from spa_jax.training.batch import bucketed_length, check_has_agent_tokens, fit_padded_lengths
from spa_jax.training.checkpoint import Checkpointer
from spa_jax.training.global_batch import global_batch_shapes, to_global_batch
from spa_jax.training.optim import OptimizerConfig, learning_rate_schedule, make_optimizer
from spa_jax.training.steps import compile_ahead, make_sft_step
from spa_jax.training.train_state import abstract_train_state, create_train_state
from spa_jax.workspace import Workspace

def expert_conversations(cfg: ml_collections.ConfigDict) -> list[af.Conversation]:
  """One conversation per purchased ScriptedExpert episode on the first sft.expert_episodes goals of
  sft.train_split (unset: env.train_split)."""
  from webshop import ScriptedExpert, WebShopEnv
  from webshop.expert import run_expert_episode

  catalogue = common.load_catalogue(cfg)
  env = WebShopEnv(catalogue, **common.env_kwargs(cfg))
  expert = ScriptedExpert(catalogue, recovery_rate=cfg.sft.expert_recovery, seed=cfg.seed)
  conversations = []
  for goal in common.split_tasks(cfg, cfg.sft.train_split or cfg.env.train_split, cfg.sft.expert_episodes):
    steps = run_expert_episode(env, goal, expert)
    if not steps[-1].info.get("reward_info"):
      continue  # no purchase: not a demonstration
    prompt = af.prompt_messages(cfg.agent.one_shot)
    messages = list(prompt)
    for step in steps:
      messages += [af.user(af.observation_message(step.observation)), af.assistant(step.response)]
    conversations.append(af.Conversation(tuple(messages), len(prompt)))
  if cfg.sft.expert_recovery:
    back = sum(any(m["content"].endswith("click[< Prev]") for m in c.messages) for c in conversations)
    logging.info("sft: %d of %d expert demonstrations go back from a product without a requested value "
                 "(sft.expert_recovery=%s)", back, len(conversations), cfg.sft.expert_recovery)
  return conversations


def load_examples(cfg: ml_collections.ConfigDict, tokenizer) -> tuple[list[af.SftExample], int]:
  """(tokenised examples that fit sft.max_len, number dropped as too long); fails on no agent tokens."""
  conversations = (expert_conversations(cfg) if cfg.sft.data == "expert"
                   else af.read_fastchat_sft(cfg.sft.data))
  if not conversations:
    raise ValueError(f"SFT data {cfg.sft.data!r} gave no conversations; check sft.data / sft.expert_episodes")
  examples = af.build_sft_examples(conversations, tokenizer)
  kept = [e for e in examples if len(e.ids) <= cfg.sft.max_len]
  if not kept:
    raise ValueError(f"every SFT example is longer than sft.max_len={cfg.sft.max_len} "
                     f"(shortest: {min(len(e.ids) for e in examples)} tokens); raise sft.max_len")
  check_has_agent_tokens(np.concatenate([e.step_mask for e in kept]), where="the SFT dataset")
  return kept, len(examples) - len(kept)


def epoch_batches(lengths: list[int], batch_size: int, max_len: int, length_bucket: int, seed: int, epoch: int,
                  padded_lengths: list[int] | None = None) -> list[tuple[int, list[int]]]:
  """(sequence length, example indices) per batch of one epoch: shuffled, grouped by length bucket:
  the next multiple of `length_bucket`, or with `padded_lengths` (ascending) the smallest that holds it."""
  rng = np.random.default_rng([seed, epoch])
  order = rng.permutation(len(lengths))
  if padded_lengths:
    bucket = lambda i: padded_lengths[bisect.bisect_left(padded_lengths, lengths[i])]  # noqa: E731
  else:
    bucket = lambda i: bucketed_length(lengths[i], length_bucket, max_len)  # noqa: E731
  order = sorted(order, key=bucket)  # stable: shuffled within buckets
  batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
  batches = [batches[i] for i in rng.permutation(len(batches))]
  return [(max(bucket(i) for i in rows), [int(i) for i in rows]) for rows in batches]


def sft_batch(examples: list[af.SftExample], rows: list[int], seq_len: int, batch_size: int,
              pad_id: int, context_weight: float = 0.0) -> dict[str, np.ndarray]:
  """tokens_bt / positions_bt / loss_mask_bt of `rows`, padded to `batch_size` rows with masked-out ones.

  loss_mask_bt weighs agent-step tokens 1, the example's other tokens `context_weight`, padding 0."""
  tokens = np.full((batch_size, seq_len), pad_id, np.int32)
  mask = np.zeros((batch_size, seq_len), np.float32)
  for r, index in enumerate(rows):
    example = examples[index]
    step_mask = np.asarray(example.step_mask, np.float32)
    tokens[r, :len(example.ids)] = example.ids
    mask[r, :len(example.ids)] = step_mask + context_weight * (1.0 - step_mask)
  positions = np.broadcast_to(np.arange(seq_len, dtype=np.int32), (batch_size, seq_len))
  return {"tokens_bt": tokens, "positions_bt": positions, "loss_mask_bt": mask}


def _process_rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """This process's contiguous block of the global batch's rows."""
  k, n = distributed.process_index(), distributed.process_count()
  return {key: x[k * (len(x) // n):(k + 1) * (len(x) // n)] for key, x in batch.items()}


def optimizer_config(cfg: ml_collections.ConfigDict, total_steps: int) -> OptimizerConfig:
  schedule = "warmup_cosine" if cfg.sft.schedule == "cosine" else "constant"
  return OptimizerConfig(learning_rate=cfg.sft.learning_rate, schedule=schedule,
                         warmup_steps=int(cfg.sft.warmup_ratio * total_steps), total_steps=total_steps,
                         weight_decay=cfg.sft.weight_decay)


def _with_lora(cfg: ml_collections.ConfigDict, model: Llama) -> Llama:
  if cfg.sft.finetune == "lora":
    lora = cfg.model.lora
    apply_lora(model, lora.rank, lora.alpha, tuple(lora.targets.split(",")), rngs=nnx.Rngs(cfg.seed + 1))
  return model


def checkpointer(cfg: ml_collections.ConfigDict, ws: Workspace) -> Checkpointer:
  """Checkpoints of this config's run (checkpoints/sft/<hash>/); other configs' ones are removed."""
  root = ws.checkpoint_dir("sft")
  current = root / common.stage_config_hash(cfg, "sft")
  if distributed.is_main_process():
    for stale in root.iterdir():
      if stale != current:
        shutil.rmtree(stale, ignore_errors=True)
  distributed.barrier("sft-checkpoints")
  return Checkpointer(current, save_every=cfg.sft.checkpoint_every, keep=cfg.sft.keep_checkpoints)


def _timed_examples(cfg: ml_collections.ConfigDict, tokenizer) -> tuple[tuple[list[af.SftExample], int], float]:
  started = time.perf_counter()
  return load_examples(cfg, tokenizer), time.perf_counter() - started


def run(cfg: ml_collections.ConfigDict, ws: Workspace) -> dict:
  times = {}
  with tracking.timed(times, "time_tokenizer_s"):
    tokenizer = common.load_tokenizer(cfg, ws)
  trainable = "lora" if cfg.sft.finetune == "lora" else "full"
  model_cfg = common.model_config(cfg, tokenizer)
  ckpt = checkpointer(cfg, ws)
  resumed = ckpt.latest_step() is not None
  # The demonstrations are host work (expert episodes, tokenisation; no JAX): they build in a thread
  # while this one starts the devices and loads the weights, so the two overlap (time_setup_s: both).
  with tracking.timed(times, "time_setup_s"), \
      concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sft-data") as pool:
    data = pool.submit(_timed_examples, cfg, tokenizer)
    with tracking.timed(times, "time_devices_s"):
      mesh = common.make_mesh(cfg)
      if not resumed:
        model_cfg, model = common.init_policy(cfg, tokenizer, mesh)
        model = _with_lora(cfg, model)
    (examples, dropped), times["time_data_s"] = data.result()
  lengths = [len(e.ids) for e in examples]
  padded_lengths = (fit_padded_lengths(lengths, cfg.sft.max_padded_lengths, cfg.sft.length_bucket, cfg.sft.max_len)
                    if cfg.sft.max_padded_lengths else None)
  plan = [batch for epoch in range(cfg.sft.epochs)
          for batch in epoch_batches(lengths, cfg.sft.batch_size, cfg.sft.max_len, cfg.sft.length_bucket,
                                     cfg.seed, epoch, padded_lengths)]
  opt_cfg = optimizer_config(cfg, len(plan))
  tx = make_optimizer(opt_cfg)

  started = time.perf_counter()
  if resumed:
    abstract = abstract_train_state(lambda: _with_lora(cfg, Llama(model_cfg, rngs=nnx.Rngs(0))), tx,
                                    trainable=trainable, mesh=mesh)
    state, _ = ckpt.restore(abstract)
    logging.info("sft: resuming from step %d of %d", int(state.step), len(plan))
  else:
    state = create_train_state(model, tx, trainable=trainable, seed=cfg.seed)
    del model

  step_fn = make_sft_step(state, num_micro_batches=cfg.sft.batch_size // cfg.sft.micro_batch_size)
  times["time_init_s"] = time.perf_counter() - started
  first_step = int(state.step)

  def local_batch(rows: list[int], seq_len: int) -> dict[str, np.ndarray]:
    return _process_rows(sft_batch(examples, rows, seq_len, cfg.sft.batch_size, tokenizer.pad_id,
                                   cfg.sft.context_loss_weight))

  with tracking.timed(times, "time_compile_s"):  # every padded length's step, side by side
    compiled_steps = compile_ahead(
        step_fn, state, {seq_len: global_batch_shapes(local_batch([], seq_len), mesh)
                         for seq_len in sorted({seq_len for seq_len, _ in plan[first_step:]})}, mesh)
  schedule = learning_rate_schedule(opt_cfg)
  metadata = {"config_hash": common.stage_config_hash(cfg, "sft"), "total_steps": len(plan)}
  final_loss = None
  train_started = time.perf_counter()
  with tracking.MetricsWriter(ws, "sft", cfg.tracking.tensorboard, append=resumed) as writer, \
      tracking.progress(len(plan), "sft", unit="step", enabled=cfg.tracking.progress) as bar:
    bar.update(first_step)
    for step in range(first_step, len(plan)):
      seq_len, rows = plan[step]
      state, metrics = compiled_steps[seq_len](state, to_global_batch(local_batch(rows, seq_len), mesh))
      bar.update(1)
      if (step + 1) % cfg.tracking.log_every == 0 or step + 1 == len(plan):
        # the loop's only wait for the device: between logging steps the next batch is built while
        # the device runs the previous one
        metrics = jax.device_get(metrics)
        final_loss = float(metrics["sft_loss"])
        bar.set_postfix(loss=f"{final_loss:.3f}")
        writer.write(step + 1, {**metrics, "learning_rate": schedule(step)})
      ckpt.save(step + 1, state, metadata, force=step + 1 == len(plan))
  ckpt.close()
  times["time_train_s"] = time.perf_counter() - train_started  # the steps and their checkpoints

  outputs = common.save_policy(ws, "sft", state.model(), model_cfg)
  if cfg.tracking.plots and distributed.is_main_process():
    tracking.plot_metrics(ws.metrics_path("sft"), ws.plot_path("sft"), title="SFT")
    outputs.append(str(ws.plot_path("sft")))
  return {"steps": len(plan), "resumed": resumed, "examples": len(examples), "dropped_too_long": dropped,
          "padded_lengths": sorted({seq_len for seq_len, _ in plan}),  # one compiled step each
          **{name: round(seconds, 2) for name, seconds in times.items()},
          "agent_tokens": int(sum(sum(e.step_mask) for e in examples)),
          "final_loss": final_loss, "outputs": outputs}
