"""The project's exception types, in a module that imports nothing, so that any module may raise
or catch them without importing the module that raises them (the engine, the model reader).

Every one is a ValueError: a user's mistake (a bad file, a prompt too long), which the commands
report in one line (mnn_h2o/cli_errors.py). Settings have their own, config.ConfigError, also a
ValueError."""


class ModelFileError(ValueError):
    """A model file that is missing, unreadable, corrupt or of an unsupported architecture."""


class ContextOverflowError(ValueError):
    """The prompt plus the requested generation does not fit the context limit."""


class SessionFileError(ValueError):
    """A file that is not a saved session this build can load (the message says why)."""


class SessionClosedError(ValueError):
    """The session was closed: its cache is gone."""
