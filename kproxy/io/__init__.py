"""The trio shell: listeners, per-connection pumps, delayed and ghost delivery, admin HTTP."""
