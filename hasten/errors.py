"""Errors whose message is meant for the user.

The CLI prints these as one line without a traceback; library callers can catch
them by type. Each subclass also derives from the built-in type a plain PyTorch
user would expect (ValueError, RuntimeError, ...).
"""


class HastenError(Exception):
    """Base class: the message says what went wrong and what to do about it."""


class DataError(HastenError, ValueError):
    """A dataset, archive or image that cannot be used as given."""


class ConfigError(HastenError, ValueError):
    """An invalid combination of options, caught before any work starts."""
