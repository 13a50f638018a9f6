"""Secrets in configuration and output: the API token's rules, and masking of passwords in Redis URLs.

    check_token(token, "control.token")                   # ValueError for a short or placeholder token
    mask_url("redis://:pw@host:6379/0?password=pw")       # 'redis://:***@host:6379/0?password=***'
    redact(text, [token, url])                            # every occurrence of a secret replaced by '***'

The control plane's bearer token guards every mutation of a run (pause, tau, k, checkpoints), so it must be
unguessable: at least MIN_TOKEN_CHARS characters and not one of the placeholders that examples and manifests
ship with. Redis URLs carry their password either as `user:password@` or as `?password=`; both are masked
wherever a URL is printed or stored.
"""

from __future__ import annotations

import re
from typing import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit

MIN_TOKEN_CHARS = 32
MASK = "***"
# Marks of a value copied from an example or a manifest without being replaced (compared in lower case).
PLACEHOLDERS = ("replace-me", "replace_me", "replaceme", "changeme", "change-me", "change_me", "your-token",
                "your_token", "example", "<", "xxxx")


def check_token(token: str, source: str) -> str:
    """The token, or ValueError naming `source` (never the token) when it is too short or a placeholder."""
    lowered = token.strip().lower()
    if any(mark in lowered for mark in PLACEHOLDERS) or len(set(lowered)) <= 2:
        raise ValueError(f"{source} is a placeholder: set a long random token (openssl rand -hex 24)")
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(
            f"{source} has {len(token)} characters; an API token needs at least {MIN_TOKEN_CHARS} "
            f"(openssl rand -hex 24)"
        )
    return token


def mask_url(url: str) -> str:
    """The URL with its password (`user:password@` and `?password=`) replaced by '***'."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not parseable as a URL: hide anything between ':' and '@'
        return re.sub(r"(?<=:)[^:/@]*(?=@)", MASK, url)
    masked = url  # pieces replaced in place: urlunsplit would turn unix:///path into unix:/path
    if password:
        user, _, host = parts.netloc.rpartition("@")
        masked = masked.replace(f"//{parts.netloc}", f"//{user.partition(':')[0]}:{MASK}@{host}", 1)
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        if any(key.lower() == "password" for key, _ in pairs):
            query = urlencode([(k, MASK if k.lower() == "password" else v) for k, v in pairs], safe="*")
            masked = masked.replace(f"?{parts.query}", f"?{query}", 1)
    return masked


def redact(text: str, secrets: Iterable[object]) -> str:
    """`text` with every string in `secrets` (of at least 4 characters) replaced by '***'."""
    for secret in secrets:
        if isinstance(secret, str) and len(secret) >= 4:
            text = text.replace(secret, MASK)
    return text
