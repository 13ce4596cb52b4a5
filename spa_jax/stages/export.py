"""Export stage: a workspace policy as a Hugging Face directory `transformers` loads.

`<export.out_dir or <ws>/export/hf>/`: config.json + safetensors (LoRA already merged in policies)
and the tokenizer: an HF tokenizer is saved as is; the SentencePiece one as `tokenizer.json`
(an equivalent `tokenizers` BPE: same ids, same text) + `tokenizer.model` + a chat template of our
format, so `AutoTokenizer.from_pretrained(dir)` encodes exactly as training did.
"""

import pathlib
import shutil

import ml_collections

from spa_jax import distributed
from spa_jax.models import save_hf
from spa_jax.models.tokenizer import (SPM_CHAT_SYMBOLS, SPM_CONTROL, SPM_END_OF_TURN, HFTokenizer,
                                      SentencePieceTokenizer, Tokenizer)
from spa_jax.stages import common
from spa_jax.workspace import Workspace

# Our SentencePiece chat format: <s> once, then <|role|>\ncontent<|end|> per turn (content trimmed).
SPM_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] | trim"
    " + '" + SPM_END_OF_TURN + "' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")


def sentencepiece_as_hf(tokenizer: SentencePieceTokenizer):
  """A `transformers.PreTrainedTokenizerFast` encoding and decoding like the SentencePiece model:
  its BPE pieces and merges, whitespace as a "▁" prefix (no dummy prefix), single digits, byte fallback."""
  from tokenizers import Tokenizer as RustTokenizer
  from tokenizers import decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast
  from transformers.convert_slow_tokenizer import SentencePieceExtractor

  pieces = SentencePieceExtractor(str(tokenizer.path)).extract(models.BPE)
  rust = RustTokenizer(models.BPE(vocab=pieces["vocab"], merges=pieces["merges"], byte_fallback=True,
                                  fuse_unk=True, unk_token=SPM_CONTROL["unk"]))
  rust.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True),
      pre_tokenizers.Digits(individual_digits=True)])
  rust.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
  # Control pieces and chat symbols are special; other user-defined symbols (product ids) are text.
  special = lambda token: token.special or token.content in SPM_CHAT_SYMBOLS  # noqa: E731
  rust.add_special_tokens([token for token in pieces["additional_special_tokens"] if special(token)])
  rust.add_tokens([token for token in pieces["additional_special_tokens"] if not special(token)])
  return PreTrainedTokenizerFast(
      tokenizer_object=rust, bos_token=SPM_CONTROL["bos"], eos_token=SPM_CONTROL["eos"],
      unk_token=SPM_CONTROL["unk"], pad_token=SPM_CONTROL["pad"],
      additional_special_tokens=list(SPM_CHAT_SYMBOLS), chat_template=SPM_CHAT_TEMPLATE)


def save_tokenizer(tokenizer: Tokenizer, out_dir: pathlib.Path) -> None:
  """Writes the tokenizer files into an HF model directory."""
  if isinstance(tokenizer, HFTokenizer):
    tokenizer._hf.save_pretrained(out_dir)
  elif isinstance(tokenizer, SentencePieceTokenizer):
    sentencepiece_as_hf(tokenizer).save_pretrained(out_dir)
    shutil.copyfile(tokenizer.path, out_dir / "tokenizer.model")
  else:
    raise TypeError(f"cannot export a {type(tokenizer).__name__}")


def export_dir(cfg: ml_collections.ConfigDict, ws: Workspace) -> pathlib.Path:
  return pathlib.Path(cfg.export.out_dir).expanduser() if cfg.export.out_dir else ws.stage_dir("export") / "hf"


def run(cfg: ml_collections.ConfigDict, ws: Workspace) -> dict:
  tokenizer = common.load_tokenizer(cfg, ws)
  mesh = common.make_mesh(cfg)
  model_cfg, model = common.load_policy(cfg, ws, cfg.export.policy, tokenizer, mesh)
  out_dir = save_hf(model, model_cfg, export_dir(cfg, ws))
  if distributed.is_main_process():
    save_tokenizer(tokenizer, out_dir)
  distributed.barrier("export")
  return {"policy": cfg.export.policy, "out_dir": str(out_dir),
          "outputs": [str(out_dir / "config.json"), str(out_dir / "tokenizer_config.json")]}
