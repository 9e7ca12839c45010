"""Data echoing (Choi et al., 2019): reuse prepared data when input is the bottleneck.

- ``echo_examples`` / ``echo_batches``: echo stages for any iterable or DataLoader;
- ``shuffle_buffer`` (``hasten.echo.shuffle_buffer``): spread echoed copies apart;
  ``default_shuffle_buffer`` sizes it;
- ``AutoEcho``: an echo factor that follows the measured upstream/downstream ratio;
- ``EchoCounters`` / ``timed_loader``: fresh examples, waits, idle fraction.
"""

from hasten.echo.auto import AutoEcho
from hasten.echo.counters import EchoCounters, timed_loader
from hasten.echo.stages import (
    VARIANTS,
    auto_shuffle_buffer,
    check_factor,
    check_variant,
    default_shuffle_buffer,
    echo_batches,
    echo_copies,
    echo_examples,
    expected_duplicate_rate,
    warn_if_small_buffer,
)
from hasten.echo.shuffle_buffer import check_buffer_size, shuffle_buffer

__all__ = [
    "AutoEcho",
    "EchoCounters",
    "VARIANTS",
    "auto_shuffle_buffer",
    "check_buffer_size",
    "check_factor",
    "check_variant",
    "default_shuffle_buffer",
    "echo_batches",
    "echo_copies",
    "echo_examples",
    "expected_duplicate_rate",
    "shuffle_buffer",
    "timed_loader",
    "warn_if_small_buffer",
]
