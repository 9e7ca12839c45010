"""What a store's errors mean, and the one line a user reads about each.

The client library (obstore) raises errors whose text is a long debug dump: the
request, its timing, the server's XML body and a Rust structure. ``one_line`` keeps
what names the cause (the HTTP status, S3's error code and message, a connection's
fate in words), masks secrets, and shortens at a word; ``transient`` says whether the
next try may fix an error (``hasten.stream.retry``); ``refused`` turns an answer no
retry changes (no such bucket, no index, no credentials) into a ``StoreError`` that
names the cause and the fix; ``unavailable`` a store that kept failing into a
``StoreUnavailable``, the one error a later rerun can cure.

Changes the training math: no.
"""

from __future__ import annotations

import os
import re

from hasten.errors import StoreError, StoreUnavailable
from hasten.stream.store_url import CREDENTIALS, StoreURL

INDEX = "index.json"
# Environment variables whose values are secrets: masked in any message, whatever prints it.
SECRETS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "GOOGLE_SERVICE_ACCOUNT_KEY",
           "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_KEY", "AZURE_STORAGE_TOKEN")
# Characters of a key, a token or a path: a secret is masked only where it stands alone, so that
# AWS_ACCESS_KEY_ID=test (moto's documented value) leaves the split folder ``test/`` of a path alone.
_WORD = r"A-Za-z0-9+/_.~-"
LIMIT = 400  # characters of a library's error kept in a message

# What the library's debug dump says beneath "error sending request", in words.
_CAUSES = (("ConnectionRefused", "connection refused"), ("ConnectionReset", "connection reset"),
           ("UnexpectedEof", "body cut short"), ("IncompleteBody", "body cut short"),
           ("kind: Timeout", "timed out"), ("dns error", "host name not found"), ("BrokenPipe", "connection broken"))
_STATUS = re.compile(r"status code: (\d{3})")
_S3_ERROR = re.compile(r"<Code>([^<]*)</Code>\s*(?:<Message>([^<]*)</Message>)?")


class ShortBody(OSError):
    """A body shorter or longer than asked for: the connection was cut, or the object changed."""


def cause(e: BaseException) -> str | None:
    text = str(e)
    return next((words for marker, words in _CAUSES if marker in text), None)


def mask(text: str) -> str:
    """``text`` with the value of every variable of ``SECRETS`` that stands alone in it replaced by ***."""
    for name in SECRETS:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = re.sub(rf"(?<![{_WORD}]){re.escape(value)}(?![{_WORD}])", "***", text)
    return text


def shorten(text: str, limit: int = LIMIT) -> str:
    """``text`` cut at a word boundary to at most ``limit`` characters, marked with ... when cut."""
    if len(text) <= limit:
        return text
    cut = text[:limit - 3]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:(") + "..."


def one_line(e: BaseException, limit: int = LIMIT) -> str:
    """An error as one short line with no secrets: the library's debug dump dropped (its
    cause kept, in words), a server's XML error reduced to its code and message, the
    request's timing left out (it names nothing)."""
    raw = str(e)
    text = " ".join(raw.split("\n\nDebug source", 1)[0].split()) or type(e).__name__
    xml = _S3_ERROR.search(raw)
    if xml is not None:
        code, message = xml.group(1), (xml.group(2) or "").strip()
        head = re.split(r":?\s*<\?xml|:?\s*<Error>", text, maxsplit=1)[0]
        text = f"{head}: {code}" + (f": {message}" if message else "")
    text = re.sub(r" in \d+(\.\d+)?(ns|µs|us|ms|s)\b", "", text)
    reason = cause(e)
    if reason is not None and reason not in text:
        text = f"{text} ({reason})"
    return shorten(mask(text), limit)


def transient(e: BaseException) -> str | None:
    """Why a retry may fix ``e`` (a short reason), or None when it cannot."""
    if isinstance(e, ShortBody):
        return f"body cut short ({e})"
    if isinstance(e, (FileNotFoundError, PermissionError)):
        return None
    name = type(e).__name__
    if name in ("PermissionDeniedError", "UnauthenticatedError", "InvalidPathError", "NotSupportedError",
                "UnknownConfigurationKeyError"):
        return None
    text = one_line(e)
    status = _STATUS.search(text)
    if status is not None:
        code = int(status.group(1))
        if code >= 500 or code in (408, 429):
            return f"HTTP {code}"
        return None  # 4xx: the request itself is wrong
    if no_credentials(text):
        return None
    if isinstance(e, OSError) or name in ("GenericError", "BaseError", "JoinError"):
        # Connection refused or reset, a timeout, a body that stopped: worth retrying.
        return cause(e) or "connection error"
    return None


def no_credentials(text: str) -> bool:
    # Without credentials in the environment the client asks the cloud's metadata service
    # (169.254.169.254 at /latest/api/token, metadata.google.internal), absent off the cloud.
    low = text.lower()
    return any(m in low for m in ("169.254.169.254", "/latest/api/token", "/latest/meta-data",
                                  "metadata.google.internal", "credential"))


def refused(e: BaseException, url: StoreURL, name: str, what: str) -> StoreError:
    """The one line for an answer no retry changes: its cause and what to do."""
    text = one_line(e, 200)
    if url.kind == "s3" and "NoSuchBucket" in str(e):
        endpoint = os.environ.get("AWS_ENDPOINT_URL")
        at = f"at {endpoint} (AWS_ENDPOINT_URL)" if endpoint else "in this account and region (AWS_REGION)"
        return StoreError(f"{url}: the bucket {url.bucket!r} does not exist {at}; check the bucket's name in the URL")
    if isinstance(e, FileNotFoundError) or "status code: 404" in text:
        if name == INDEX:
            return StoreError(f"no {INDEX} at {url}: pack the data with `hasten data pack SRC OUTDIR` and "
                              "upload OUTDIR whole, or give the URL of the folder that holds index.json "
                              "(docs/remote.md)")
        return StoreError(f"{what} is listed in {url.join(INDEX)} but not at {url.join(name)}: "
                          "upload the packed directory whole")
    if no_credentials(text) or type(e).__name__ in ("UnauthenticatedError", "PermissionDeniedError") \
            or re.search(r"status code: 40[13]", text):
        return StoreError(f"{url}: no credentials, or they do not give access ({text}); "
                          f"credentials are read from: {CREDENTIALS[url.kind]}")
    return StoreError(f"{what} of {url}: {text}")


def unavailable(url: StoreURL, what: str, tries: int, reason: str, last: BaseException) -> StoreUnavailable:
    """The one line for a store that failed every try, in a way a later try may not."""
    count = "1 try" if tries == 1 else f"{tries} tries"
    return StoreUnavailable(f"{what} of {url}: {count} failed ({reason}); last error: {one_line(last)}")
