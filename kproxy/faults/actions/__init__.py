"""Fault actions, one per module, registered by name in `ACTIONS`.

Importing this package imports every action module, which registers it.
"""

from kproxy.faults.actions import (  # noqa: F401  (imported for registration)
    delay,
    disconnect,
    drop,
    drop_response,
    duplicate,
    hold,
    replace_error,
    respond,
    rewrite,
)
from kproxy.faults.actions.registry import ACTIONS, ActionParams, ActionSpec, register

__all__ = ["ACTIONS", "ActionParams", "ActionSpec", "register"]
