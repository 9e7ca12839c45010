"""Errors whose message is meant for the user.

The CLI prints these as one line without a traceback; library callers can catch
them by type. Each subclass also derives from the built-in type a plain PyTorch
user would expect (ValueError, RuntimeError, ...).
"""

import signal


class HastenError(Exception):
    """Base class: the message says what went wrong and what to do about it."""


class DataError(HastenError, ValueError):
    """A dataset, archive or image that cannot be used as given."""


class BadImageError(DataError):
    """A file that is not a readable JPEG or PNG image (``hasten.decode``): readers skip
    and count it by name (``hasten.data.bad_files``)."""


class StoreError(DataError):
    """Remote storage that cannot be read as given (``hasten.stream.remote_store``): no such
    bucket, no index, no credentials. Rerunning the same command changes nothing."""


class StoreUnavailable(StoreError):
    """Remote storage that still failed after every retry (down, unreachable, throttling):
    a run it stops names its newest checkpoint, to resume from once the store answers."""


class ConfigError(HastenError, ValueError):
    """An invalid combination of options, caught before any work starts."""


class Terminated(BaseException):
    """Raised in the main thread when SIGTERM arrives (``hasten.cli`` and
    ``hasten.distributed.faults.stop_on_sigterm`` install the handler).

    A BaseException, like KeyboardInterrupt, so that ``except Exception`` blocks in
    user code do not swallow the request to stop."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
