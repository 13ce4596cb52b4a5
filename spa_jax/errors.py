"""Errors the entry point reports as one line (no traceback): their messages name the file and the fix."""


class InputFileError(ValueError):
  """An input file (weights, SFT data, GGUF, config.json) that is damaged or not what it should be."""
