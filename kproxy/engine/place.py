"""Where a user's engine lives: its socket, its key and what it said about itself.

One engine per user and machine, under $XDG_RUNTIME_DIR/kproxy-engine (else
~/.cache/kproxy/engine; $KPROXY_ENGINE_DIR chooses another, as the test
suite does so that no engine of the user's answers its analyses). The key is a random secret readable by the user
alone: a connection must prove it knows the key (multiprocessing's
authenticated handshake) before the engine reads anything from it.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def engine_dir() -> Path:
    """$KPROXY_ENGINE_DIR, else the per-user runtime directory, else the cache."""
    chosen = os.environ.get("KPROXY_ENGINE_DIR")
    if chosen:
        return Path(chosen)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.access(runtime, os.W_OK):
        return Path(runtime) / "kproxy-engine"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kproxy" / "engine"


@dataclass(frozen=True)
class Place:
    directory: Path

    @property
    def socket(self) -> Path:
        return self.directory / "engine.sock"

    @property
    def key_file(self) -> Path:
        return self.directory / "key"

    @property
    def state_file(self) -> Path:
        """What the running engine wrote about itself (pid, master, started, log), as JSON."""
        return self.directory / "engine.json"

    @property
    def log_file(self) -> Path:
        return self.directory / "engine.log"

    def new_key(self) -> bytes:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = secrets.token_bytes(32)
        fd = os.open(self.key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(key)
        return key

    def key(self) -> bytes | None:
        try:
            return self.key_file.read_bytes()
        except OSError:
            return None

    def state(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None

    def write_state(self, state: dict[str, Any]) -> None:
        partial = self.state_file.with_suffix(".partial")
        partial.write_text(json.dumps(state, indent=2) + "\n")
        partial.replace(self.state_file)

    def clear(self) -> None:
        for path in (self.socket, self.state_file):
            path.unlink(missing_ok=True)


def default_place() -> Place:
    return Place(engine_dir())
