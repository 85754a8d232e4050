"""What rule matching sees of one request or response."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class ExchangeView:
    """The facts about one frame that rules can match on.

    Header facts (api, version, client id) are always known. Body facts are
    None unless the proxy decoded the body, which it does only when
    `FaultEngine.needs_body` says a rule needs them; a rule that asks for a
    body fact never matches a view where that fact is None.
    """

    api_key: int
    api_version: int
    direction: Literal["request", "response"] = "request"
    client_id: str | None = None
    transactional_id: str | None = None
    # ((topic, (partition, ...)), ...) named by the frame
    topics: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    # EndTxn only: True to commit, False to abort
    committed: bool | None = None
    # the synthetic client-side transaction number the tracker gave this frame (1 = first)
    txn_number: int | None = None
