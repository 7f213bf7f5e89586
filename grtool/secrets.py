"""Credentials: what is redacted, in which encodings, before anything is printed or written.

Three kinds of redaction:

- **Command lines** (:func:`redact_argv`, recorded in manifests, index.json and export sidecars): the value of an
  option *named* like a credential (``--api-key``, ``--token``, ``--password``, ``--hf-token``; whole words of the
  name, so ``--tokenizer`` and ``--max-tokens`` are kept), values that look like keys (``sk-…``, ``Bearer …``),
  and the credentials inside URLs (``user:password@``, secret-looking query values). ``--api-key-env NAME``
  names a variable and is kept.
- **Texts** (:func:`scrub`: error messages, log lines, tracebacks): every credential this process was given
  (:func:`register`, :func:`register_url`) in every form it may take on the way out — as given, percent-encoded
  (any character, either hex case, ``+`` for space: servers and HTTP libraries echo URLs encoded), and as the
  base64 of an HTTP Basic ``user:password`` — plus any ``Authorization``/``Bearer``/``Basic`` header value and
  any URL user-info, registered or not.
- **Stored answers** (:func:`redact_known`: what a model or server answered, as kept in rows, ``llm_calls``,
  rejects and the request cache): the registered credentials in all those encodings, and nothing else, so
  that data which merely looks like a header or a URL with user-info is kept as it is.

Registering a credential also installs the scrubbing on the ``grtool`` logger and on uncaught-exception
tracebacks, so a message that escapes its own scrubbing is still cleaned before it reaches stderr.
"""

from __future__ import annotations

import base64
import logging
import re
import sys
import threading
from collections.abc import Iterable
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

MASK = "***"

# Whole words of an option's name (split on - and _) that make its value a credential.
_SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "pwd", "authorization", "auth", "credential", "credentials", "cookie"})
# Values that are keys whatever option carries them: a key-like word, or one credential after an auth scheme
# (not free text such as a --system prompt starting with "Basic").
_SECRET_VALUE = re.compile(r"^(?:(?:sk-|hf_|ghp_)\S+|(?i:bearer|basic)\s+(?![a-z]+$)[A-Za-z0-9._~+/=-]{8,})$")
# Shortest registered credential scrubbed as a substring: shorter ones would eat ordinary text.
MIN_SECRET_CHARS = 4


def is_secret_name(name: str) -> bool:
    """An option or query parameter named like a credential; ``...-env`` names a variable holding one and is not."""
    words = [w for w in re.split(r"[-_.\s]+", name.lstrip("-").lower()) if w]
    if not words or words[-1] == "env":
        return False
    return any(w in _SECRET_WORDS for w in words)


# ------------------------------------------------------------------------------------- command lines


def redact_argv(argv: Iterable[str]) -> list[str]:
    """The command line as recorded in manifests: credentials replaced by ``***``, everything else kept."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        arg = str(arg)
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if is_secret_name(name):
                if eq:
                    out.append(f"{name}={MASK}")
                else:
                    out.append(arg)
                    hide_next = True
                continue
            if eq:
                out.append(f"{name}={_redact_value(value)}")
                continue
            out.append(arg)
            continue
        out.append(_redact_value(arg))
    return out


def _redact_value(value: str) -> str:
    if _SECRET_VALUE.match(value):
        return MASK
    return scrub(redact_url(value), generic=False)  # known credentials only: option values are no error text


def redact_url(text: str) -> str:
    """A URL without its credentials: ``user:password@`` and secret-looking query values become ``***``."""
    if "://" not in text:
        return text
    try:
        u = urlsplit(text)
    except ValueError:
        return _USERINFO.sub(r"\1" + MASK + "@", text)
    netloc = f"{MASK}@" + u.netloc.rsplit("@", 1)[1] if "@" in u.netloc else u.netloc
    query = u.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, MASK if is_secret_name(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((u.scheme, netloc, u.path, query, u.fragment))


def split_url_credentials(url: str) -> tuple[str, str | None, str | None]:
    """``(url without user-info, user, password)``, user and password percent-decoded (as HTTP Basic sends them)."""
    try:
        u = urlsplit(url)
    except ValueError:
        return url, None, None
    if "@" not in u.netloc:
        return url, None, None
    userinfo, host = u.netloc.rsplit("@", 1)
    user, _, password = userinfo.partition(":")
    return urlunsplit((u.scheme, host, u.path, u.query, u.fragment)), unquote(user), unquote(password)


# ------------------------------------------------------------------------------------------- texts

_lock = threading.Lock()
_patterns: dict[str, re.Pattern[str]] = {}  # one per registered credential (every encoding of it)
_exact: set[str] = set()  # forms scrubbed verbatim (base64 Basic credentials)
_hooks_installed = False

# Credentials in any text, registered or not.
_USERINFO = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@?#]+@")
# A credential after an auth scheme: 8+ characters, not a plain lowercase word ("Basic authentication").
_AUTH_SCHEME = re.compile(r"\b((?i:bearer|basic|token|digest))(\s+)(?![a-z]+\b)[A-Za-z0-9._~+/=:-]{8,}")
_AUTH_HEADER = re.compile(r"""(["']?\b(?:proxy-)?(?:authorization|x-api-key|api-key|cookie)["']?\s*[:=]\s*["']?)([^"'\r\n,}]+)""", re.IGNORECASE)


def _encoded_pattern(secret: str) -> re.Pattern[str]:
    """``secret`` as given or percent-encoded character by character (either hex case, ``+`` for a space)."""
    parts = []
    for ch in secret:
        alts = [re.escape(ch)]
        alts.append("".join(f"%[{h[0]}{h[0].lower()}][{h[1]}{h[1].lower()}]" for h in (f"{b:02X}" for b in ch.encode())))
        if ch == " ":
            alts.append(r"\+")
        parts.append("(?:" + "|".join(alts) + ")")
    return re.compile("".join(parts))


def register(secret: str | None) -> None:
    """Scrub ``secret`` from every text this process prints from now on (all its encodings)."""
    if not secret:
        return
    # Also as it shows in messages about a value that could not be sent: around whitespace dropped (a key read
    # from a file with its newline), control characters escaped as Python prints str and bytes ("Illegal header
    # value b'Bearer sk-...\\n'").
    shown = {secret.strip(), repr(secret)[1:-1], repr(secret.encode("utf-8", "backslashreplace"))[2:-1]}
    with _lock:
        for form in {secret, unquote(secret), *shown}:
            if len(form) >= MIN_SECRET_CHARS and form not in _patterns:
                _patterns[form] = _encoded_pattern(form)
    _install_hooks()


def register_url(url: str | None) -> None:
    """Register the credentials a URL carries: its password, ``user:password`` (as given and decoded, and in
    the base64 HTTP Basic form) and its secret-looking query values."""
    if not url or "://" not in url:
        return
    try:
        u = urlsplit(url)
    except ValueError:
        return
    if "@" in u.netloc:
        userinfo = u.netloc.rsplit("@", 1)[0]
        user, _, password = userinfo.partition(":")
        register(password)
        register(userinfo if password else None)
        basic = {f"{user}:{password}", f"{unquote(user)}:{unquote(password)}"}
        with _lock:
            _exact.update(base64.b64encode(b.encode()).decode() for b in basic)
    for k, v in parse_qsl(u.query, keep_blank_values=True):
        if is_secret_name(k):
            register(v)
    _install_hooks()


def scrub(text: str, *, generic: bool = True, userinfo: bool = True) -> str:
    """``text`` without any registered credential (in any encoding), without (``userinfo``) any URL user-info, and
    (``generic``) without any ``Authorization``/``Bearer``/``Basic`` header value, registered or not."""
    if not text:
        return text
    with _lock:
        patterns = sorted(_patterns.items(), key=lambda kv: -len(kv[0]))  # longest first: user:password before password
        exact = sorted(_exact, key=len, reverse=True)
    for form in exact:
        text = text.replace(form, MASK)
    for _, pattern in patterns:
        text = pattern.sub(MASK, text)
    if generic:
        text = _AUTH_HEADER.sub(lambda m: m.group(1) + MASK, text)
        text = _AUTH_SCHEME.sub(lambda m: m.group(1) + m.group(2) + MASK, text)
    return _USERINFO.sub(r"\1" + MASK + "@", text) if userinfo else text


def registered() -> bool:
    """Whether this process was given any credential to keep out of what it prints and stores."""
    with _lock:
        return bool(_patterns or _exact)


def known_spans(text: str) -> list[tuple[int, int]]:
    """Where the registered credentials (in any of their encodings) occur in ``text``: (start, end) pairs."""
    if not text:
        return []
    with _lock:
        patterns = list(_patterns.values())
        exact = list(_exact)
    spans = [m.span() for pattern in patterns for m in pattern.finditer(text)]
    for form in exact:
        at = text.find(form)
        while at >= 0:
            spans.append((at, at + len(form)))
            at = text.find(form, at + 1)
    return sorted(spans)


def redact_known(text: str) -> str:
    """``text`` with the registered credentials (every encoding) masked, and nothing else changed.

    For what grtool *stores* from a model or server (rows, ``llm_calls``, the request cache, rejects): unlike
    :func:`scrub`, prose that merely looks like a header or a URL with user-info ("Basic Instinct",
    ``ssh://git@host``) is data and is kept.
    """
    if not text or not registered():
        return text
    return scrub(text, generic=False, userinfo=False)


def forget_all() -> None:
    """Drop every registered credential (tests)."""
    with _lock:
        _patterns.clear()
        _exact.clear()


class ScrubFilter(logging.Filter):
    """Scrubs a log record's final message (arguments merged in) before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True
        clean = scrub(message)
        if clean != message:
            record.msg, record.args = clean, ()
        return True


def _install_hooks() -> None:
    global _hooks_installed
    with _lock:
        if _hooks_installed:
            return
        _hooks_installed = True
    logger = logging.getLogger("grtool")
    if not any(isinstance(f, ScrubFilter) for f in logger.filters):
        logger.addFilter(ScrubFilter())

    def scrubbing_excepthook(exc_type, exc, tb):  # an unexpected crash prints a traceback: clean it too
        import traceback

        sys.stderr.write(scrub("".join(traceback.format_exception(exc_type, exc, tb))))

    sys.excepthook = scrubbing_excepthook
