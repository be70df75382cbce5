"""Secrets in the configuration: which keys hold one, and the credentials a URI carries (``user:password@``, a
token as the user part), masked wherever a URI is shown and registered with the log's redaction."""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"
# A key holding one of these words, or a part named "key"/"pem"/"sas"/"jaas", carries a secret; so do
# librdkafka's OAUTHBEARER config (it may hold a client secret) and Hadoop's per-container SAS tokens.
_SECRET_WORDS = ("password", "secret", "token", "credential", "oauthbearer.config")
_SECRET_PARTS = frozenset({"key", "pem", "sas", "jaas"})


def is_secret_key(key: str) -> bool:
    """``sasl.password``, ``ssl.key.pem``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ACCESS_KEY_ID``,
    ``sasl.oauthbearer.config``, ``sasl.jaas.config``, ``spark.hadoop.fs.azure.sas.<container>.<account>`` … are
    secrets."""
    lowered = key.lower()
    parts = set(re.split(r"[._]", lowered))
    return any(word in lowered for word in _SECRET_WORDS) or bool(parts & _SECRET_PARTS)


# Object-store URIs whose user part names a container, not a user (``abfss://container@account…``).
_CONTAINER_USER_SCHEMES = frozenset({"abfs", "abfss", "az", "azure", "adl", "wasb", "wasbs"})


def without_credentials(text: str) -> str:
    """``text`` (a URI, or what was meant as one) with its credentials masked: the password of
    ``user:password@host``, a lone user part of a URL (a token), and ``user:password@host:8081`` written with no
    scheme (it parses as scheme ``user``). An Azure URI's container stays readable."""
    parts = urlsplit(text)
    if unencoded := _unencoded_userinfo(text):
        return f"{unencoded[0]}:{MASK}@{unencoded[2]}"
    if "@" not in parts.netloc:
        return f"{MASK}@{text.rsplit('@', 1)[1]}" if _schemeless_userinfo(text) else text
    user, host = parts.netloc.rsplit("@", 1)
    if ":" in user:
        user = f"{user.split(':', 1)[0]}:{MASK}"
    elif parts.scheme.lower() not in _CONTAINER_USER_SCHEMES:
        user = MASK
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


_PORT_AND_PATH = re.compile(r"\d*(?:[/?#]|$)")


def _unencoded_userinfo(text: str) -> tuple[str, str, str] | None:
    """``scheme://user``, the password and what follows its ``@`` in ``scheme://user:pass/word@host…``: a ``/``,
    ``?`` or ``#`` in a password that is not percent-encoded ends the URL's host part before the ``@`` (found by
    review: nothing was masked). Not ``scheme://host:8081/path@x`` (a port) nor ``http://[::1]:8081/a@b`` (an IPv6
    host); ``user:123/x@host`` cannot be told from a port and a path, and is not masked."""
    scheme, sep, rest = text.partition("://")
    head, at, tail = rest.partition("@")
    user, colon, secret = head.partition(":")
    if not sep or not at or not colon or "@" in urlsplit(text).netloc or rest.startswith("["):
        return None
    if re.search(r"[/?#]", user) or not re.search(r"[/?#]", secret) or _PORT_AND_PATH.match(secret):
        return None
    return f"{scheme}://{user}", secret, tail


def _schemeless_userinfo(text: str) -> bool:
    """``user:password@host…`` with no ``://`` (a local path that holds an ``@`` has a ``/`` before it)."""
    head = text.rpartition("@")[0]
    return "://" not in text and ":" in head and "/" not in head


_MIN_TOKEN_LENGTH = 16
"""A lone user part this long is taken for a token (``https://<token>@host``); a shorter one for a user name
(``https://admin@host``), which, redacted, would mask that word in every log line."""


def uri_secrets(text: str) -> list[str]:
    """The secret a URI carries in its user part (see :func:`without_credentials`), as written and
    percent-decoded; none for a lone user name."""
    parts = urlsplit(text)
    if unencoded := _unencoded_userinfo(text):
        secret = unencoded[1]
    elif "@" not in parts.netloc:
        secret = text.rpartition("@")[0].split(":", 1)[1] if _schemeless_userinfo(text) else ""
    else:
        user = parts.netloc.rsplit("@", 1)[0]
        if ":" in user:
            secret = user.split(":", 1)[1]
        elif parts.scheme.lower() in _CONTAINER_USER_SCHEMES or len(user) < _MIN_TOKEN_LENGTH:
            secret = ""
        else:
            secret = user
    return [form for form in dict.fromkeys((secret, unquote(secret))) if form]
