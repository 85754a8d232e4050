"""How big a rule document may be, and the range of every numeric rule field.

Rule files are hot-reloaded and rules arrive over HTTP, so whatever is
written there is hostile until checked: a reload may fail, the proxy may not.
Each bound is far above what a real scenario needs and low enough that
reading, validating and installing the largest accepted document takes well
under a second. docs/rules.md lists them for users.
"""

from __future__ import annotations

# -- documents (a rule file, or one rule's JSON body) ----------------------------

# Larger files are refused unread; the admin API answers 413 for larger bodies.
MAX_DOCUMENT_BYTES = 1024 * 1024
# A rule file nests six levels deep (rules[0].match.txn_number.min); the
# bound keeps every walk over the data shallow, whatever the input.
MAX_NESTING_DEPTH = 32
# Every scalar, list and mapping counts once, and again each time an alias
# repeats it: a few hundred bytes of nested aliases (a "billion laughs"
# document) would otherwise expand to gigabytes.
MAX_VALUES = 50_000
# Rule ids are metric labels: their number must stay bounded.
MAX_RULES = 1000
# A glob (client_id, transactional_id, topic) in UTF-8 bytes. Kafka topics
# are at most 249 characters; a longer pattern is a mistake or an attack, and
# compiling and matching it must stay cheap (a 1 MB glob took seconds).
MAX_GLOB_BYTES = 4096

# -- numeric fields --------------------------------------------------------------

# delay ms and jitter_ms, duplicate spacing_ms, hold timeout_ms: an hour.
# A longer "delay" is a drop; a longer hold is better written without a timeout.
MAX_FAULT_MS = 3_600_000.0
# limits.duration_s and schedule phase durations: thirty days.
MAX_DURATION_S = 30 * 24 * 3600.0
# nth, every, after, count, lag, partition and transaction numbers: Kafka's int32.
MAX_COUNT = 2**31 - 1
# API versions are int16 on the wire.
MAX_API_VERSION = 2**15 - 1
# SplitMix64 seeds are 64-bit.
MAX_SEED = 2**64 - 1
