"""The one exception type for user mistakes."""


class ConfigError(ValueError):
    """A bad configuration value: the message names the key path and what is allowed.

    The CLI turns it into one line on stderr and exit code 2.
    """
