"""The admin API's bearer token, kept in a file so it never shows in `ps` or in shell history."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

# Shorter secrets can be guessed over the network; 32 random bytes make 43 characters.
MIN_TOKEN_CHARS = 16
_GENERATED_BYTES = 32


class AdminTokenError(ValueError):
    pass


def read_token(path: Path) -> str:
    """The token in `path`: its only line, surrounding whitespace ignored."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AdminTokenError(f"cannot read the admin token file {path}: {exc}") from None
    token = text.strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise AdminTokenError(f"the admin token in {path} is shorter than {MIN_TOKEN_CHARS} characters")
    # It travels in an HTTP header: visible ASCII only, and one word.
    if not all("!" <= ch <= "~" for ch in token):
        raise AdminTokenError(f"the admin token in {path} must be one word of visible ASCII characters")
    return token


def write_new_token(path: Path) -> str:
    """Write a fresh random token to `path` (readable by its owner only) and return it."""
    token = secrets.token_urlsafe(_GENERATED_BYTES)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(token + "\n")
        # Whoever reads the file sees the old token or the new one, never half of it.
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise AdminTokenError(f"cannot write the admin token file {path}: {exc}") from None
    return token
