"""Errors a worker raises at start-up, before it may become ready."""


class ModelLoadError(RuntimeError):
    """A checkpoint directory cannot serve the asked role; the message names the path and what is missing."""


class MissingImageProcessorError(ModelLoadError):
    """An encoder was pointed at a checkpoint without an image processor config."""
