"""The one error a model directory that cannot be loaded raises."""


class ModelLoadError(Exception):
    """A model directory cannot be loaded; the message names the file (and tensor) at fault."""
