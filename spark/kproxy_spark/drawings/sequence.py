"""A drawn case's wire story (kproxy_spark.drawings.wire_story) as an SVG
sequence diagram: client, proxy and broker lanes, time flowing down, one
row per request, delivery or response, in the order they happened.

A row's time is the proxy's clock, in milliseconds after the first row.
A request delivered at once shares its arrival's row; one a rule held, or
a copy the proxy made, gets its own row at delivery, with the hold drawn
on the proxy's lane. Beside the broker lane: what each EndTxn decided (the
records it committed or aborted and the producer's marker after them), and
where the log disagrees with that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kproxy_spark.drawings import svg
from kproxy_spark.wire.phrases import error as error_name

#: Delivered within this of its arrival: drawn in one row with it.
SAME_ROW_NS = 2_000_000
LANES = {"client": 180, "proxy": 490, "broker": 750}
NOTES_X, WIDTH = 770, 1200
TOP, ROW = 70, 34
#: Width of one character of a 10.5 px label, on average: how long a label fits between two lanes.
CHAR_PX = 5.8
#: What a rule did to the request it matched, as its row's note says.
DID = {"duplicate": "copied it and held the copy", "hold": "held it", "delay": "delayed it", "drop": "dropped it",
       "respond": "answered it itself", "replace_error": "replaced its answer with an error",
       "rewrite": "rewrote it", "disconnect": "closed its connection", "drop_response": "dropped its answer"}
MAX_ROWS = 60


@dataclass
class Row:
    time_ns: int
    order: int  # ties: arrival before delivery before response
    start: str
    end: str
    labels: list[str]
    colour: str = svg.INK
    dashed: bool = False
    via_proxy: bool = False  # one arrow through the proxy lane (client to broker or back)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (text, colour) beside the broker lane
    key: tuple | None = None  # the exchange, for holds


def _pairs(records: list[Mapping[str, Any]]) -> str:
    return " ".join(f"[{r.get('key')},{r.get('value')}]" for r in records)


def _exchange(e: Mapping[str, Any]) -> str:
    return f"conn {e.get('conn_id')}, corr {e.get('correlation_id')}" + (
        f", copy {e['copy']}" if e.get("copy") else "")


def _acted(e: Mapping[str, Any]) -> str | None:
    if e.get("rule") is None:
        return None
    did = DID.get(e.get("action"), f"acted ({e.get('action')})")
    return f"rule '{svg.shorten(str(e['rule']), 34)}' {did}"


def _decided_notes(end: Mapping[str, Any], story: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What this EndTxn decided, and the marker that shows it in the log."""
    me = [end.get("conn_id"), end.get("correlation_id"), end.get("copy")]
    decided = [r for p in story.get("produces", ()) for r in p["records"] if r.get("decided_by") == me]
    notes = []
    for fate in ("committed", "aborted"):
        records = [r for r in decided if r.get("fate") == fate]
        if records:
            notes.append((f"{'commits' if fate == 'committed' else 'aborts'} {_pairs(records)}",
                          svg.GREEN if fate == "committed" else svg.RED))
    places = {(r["topic"], r["partition"], r["marker"]["offset"]): r["marker"]["control"]
              for r in decided if r.get("marker")}
    for (topic, partition, offset), control in sorted(places.items()):
        notes.append((f"{str(control).upper()} marker {svg.shorten(topic, 26)}[{partition}] @{offset}",
                      svg.GREEN if control == "commit" else svg.RED))
    disagree = [r for r in decided if r.get("log_fate") and r.get("log_fate") != r.get("fate")]
    if disagree:
        notes.append((f"yet the log's next marker left {_pairs(disagree)} {disagree[0]['log_fate']}", svg.RED))
    return notes


def _end_rows(end: Mapping[str, Any], story: Mapping[str, Any]) -> list[Row]:
    name = f"EndTxn({'commit' if end.get('end_txn_commit') else 'abort'}) client txn {end.get('txn_client')}"
    key = (end.get("conn_id"), end.get("correlation_id"))
    arrival, delivery = end.get("mono_ns"), end.get("delivery_ns") or end.get("mono_ns")
    stale = end.get("hazard") is not None
    inside = f"delivered while broker txn {end.get('txn_broker')} was open" if stale else \
        f"in broker txn {end.get('txn_broker')}"
    colour = svg.RED if stale else svg.INK
    notes = _decided_notes(end, story) if end.get("delivered") else []
    rows = []
    if end.get("copy"):
        rows.append(Row(min(arrival, delivery), 1, "proxy", "broker",
                        [f"copy {end['copy']}: {name}", inside], colour if stale else svg.ORANGE, dashed=True,
                        notes=notes, key=key))
    elif delivery - arrival <= SAME_ROW_NS:
        rows.append(Row(arrival, 0, "client", "broker", [f"{name} ({_exchange(end)})", inside], colour,
                        via_proxy=True, notes=notes, key=key))
    else:
        rows.append(Row(arrival, 0, "client", "proxy", [f"{name} ({_exchange(end)})"], key=key))
        rows.append(Row(delivery, 1, "proxy", "broker", ["delivered late,", inside], colour, notes=notes, key=key))
    if end.get("response_ns") is not None:
        error = end.get("response_error_code")
        answer = "ok" if not error else error_name(error)
        if end.get("copy"):
            rows.append(Row(end["response_ns"], 2, "broker", "proxy", [f"{answer} (the proxy discards it)"], svg.GREY,
                            dashed=True))
        else:
            rows.append(Row(end["response_ns"], 2, "broker", "client", [f"EndTxn answer: {answer}"], svg.GREY,
                            via_proxy=True))
    if _acted(end) and not end.get("copy"):
        rows[0].notes.insert(0, (_acted(end), svg.ORANGE))
    return rows


def _produce_rows(p: Mapping[str, Any]) -> list[Row]:
    records = p.get("records") or []
    name = f"Produce {_pairs(records)}"
    arrival, delivery = p.get("mono_ns"), p.get("delivery_ns") or p.get("mono_ns")
    late = p.get("hazard") is not None
    inside = f"client txn {p.get('txn_client')} → broker txn {p.get('txn_broker')}" + (
        f" ({p['hazard'].replace('_', ' ')})" if late else "")
    colour = svg.RED if late else svg.INK
    label = f"{name} ({_exchange(p)})"
    rows = []
    if p.get("copy"):
        rows.append(Row(min(arrival, delivery), 1, "proxy", "broker", [f"copy {p['copy']}: {name}", inside],
                        svg.ORANGE, dashed=True))
    elif delivery - arrival <= SAME_ROW_NS:
        rows.append(Row(arrival, 0, "client", "broker", [label, inside], colour, via_proxy=True))
    else:
        rows.append(Row(arrival, 0, "client", "proxy", [label, f"client txn {p.get('txn_client')}"],
                        key=(p.get("conn_id"), p.get("correlation_id"))))
        rows.append(Row(delivery, 1, "proxy", "broker", ["delivered late,", inside], colour,
                        key=(p.get("conn_id"), p.get("correlation_id"))))
    if _acted(p) and not p.get("copy"):
        rows[0].notes.insert(0, (_acted(p), svg.ORANGE))
    if p.get("response_ns") is not None:
        offsets = [r.get("offset") for r in records if r.get("offset") is not None]
        errors = sorted({r.get("error") for r in records if r.get("error")})
        answer = (f"offsets {', '.join(map(str, offsets))}" if offsets else "no offset") + (
            f", {', '.join(error_name(e) for e in errors)}" if errors else "")
        rows.append(Row(p["response_ns"], 2, "broker", "proxy" if p.get("copy") else "client",
                        [f"Produce answer: {answer}"], svg.GREY, dashed=bool(p.get("copy")),
                        via_proxy=not p.get("copy")))
    return rows


def _fetch_rows(f: Mapping[str, Any], story: Mapping[str, Any]) -> list[Row]:
    records = [r for r in f.get("records") or [] if r.get("control") is None]
    offsets = [r["offset"] for r in records]
    listed = ", ".join(f"producer {a.get('producer_id')} from @{a.get('first_offset')}"
                       for a in f.get("aborted_transactions") or [])
    where = f"{svg.shorten(str(f.get('topic')), 22)}[{f.get('partition')}]"
    labels = [f"Fetch response ({_exchange(f)}) " + (f"@{min(offsets)}..{max(offsets)}" if offsets else "empty"),
              f"{where}, last stable offset {f.get('last_stable_offset')}"]
    # The fates the story knows (the anchored records' own), to tell what the response did wrong.
    fate = {(r["topic"], r["partition"], r["offset"]): r.get("log_fate") or r.get("fate")
            for p in story.get("produces", ()) for r in p["records"]}
    of = {id(r): fate.get((f.get("topic"), f.get("partition"), r["offset"])) for r in records}
    kept = [r for r in records if of[id(r)] == "aborted" and not r.get("listed_aborted")]
    dropped = [r for r in records if of[id(r)] == "committed" and r.get("listed_aborted")]
    notes = [(f"aborted list: {listed or 'empty'}", svg.INK)]
    if kept:
        notes.append((f"serves aborted {_pairs(kept)} with no aborted-list entry: the client keeps it", svg.RED))
    if dropped:
        notes.append((f"lists committed {_pairs(dropped)} as aborted: the client drops it", svg.RED))
    return [Row(f["mono_ns"], 2, "broker", "client", labels, svg.INK, via_proxy=True, notes=notes)]


def rows_of(story: Mapping[str, Any]) -> list[Row]:
    rows = [row for p in story.get("produces", ()) for row in _produce_rows(p)]
    rows += [row for e in story.get("end_txns", ()) for row in _end_rows(e, story)]
    rows += [row for f in story.get("fetches", ()) for row in _fetch_rows(f, story)]
    return sorted(rows, key=lambda r: (r.time_ns, r.order))


def _client_name(story: Mapping[str, Any]) -> tuple[str, str]:
    """(lane title, what it is)."""
    for p in (*story.get("produces", ()), *story.get("end_txns", ())):
        if p.get("transactional_id"):
            producer = f"producer {p['producer_id']}, " if p.get("producer_id") is not None else ""
            return "client", producer + svg.shorten(p["transactional_id"], 32)
    for f in story.get("fetches", ()):
        return "consumer", svg.shorten(str(f.get("client_id")), 36)
    return "client", ""


def _arrow(row: Row, y: float) -> list[str]:
    head = "head-" + {svg.RED: "red", svg.ORANGE: "orange", svg.GREY: "grey"}.get(row.colour, "ink")
    x1, x2 = LANES[row.start], LANES[row.end]
    shift = 6 if x2 > x1 else -6  # stop short of the lane line, so the head shows
    parts = [svg.line(x1, y, x2 - shift, y, row.colour, dashed=row.dashed, arrow=head)]
    if row.via_proxy and len(row.labels) > 1:
        # The first label over the client's half, the second over the broker's.
        left, right = sorted((x1, LANES["proxy"])), sorted((LANES["proxy"], x2))
        halves = (left, right) if x2 > x1 else (right, left)
        for (a, b), label in zip(halves, row.labels):
            limit = int((b - a) / CHAR_PX)
            parts.append(svg.text((a + b) / 2, y - 5, svg.shorten(label, limit), 10.5, row.colour, "middle"))
    else:
        a, b = sorted((x1, x2))
        limit = int((b - a) / CHAR_PX)
        for i, label in enumerate(reversed(row.labels)):
            parts.append(svg.text((a + b) / 2, y - 5 - 12 * i, svg.shorten(label, limit), 10.5, row.colour, "middle"))
    return parts


def sequence_svg(story: Mapping[str, Any], title: str) -> str:
    """The story as one <svg> element."""
    rows = rows_of(story)
    hidden = max(len(rows) - MAX_ROWS, 0)
    rows = rows[:MAX_ROWS]
    # A row with several notes beside it is as tall as they need.
    ys, y = [], TOP
    for row in rows:
        y += max(ROW, 12 * len(row.notes) + 10)
        ys.append(y)
    height = y + ROW + 40
    t0 = rows[0].time_ns if rows else 0
    body = [svg.arrow_heads({"head-ink": svg.INK, "head-red": svg.RED, "head-orange": svg.ORANGE,
                             "head-grey": svg.GREY})]
    for lane, x in LANES.items():
        name, detail = {"client": _client_name(story), "proxy": ("kproxy", "rules act here"),
                        "broker": ("broker", "the log")}[lane]
        body.append(f"<rect x='{x - 125}' y='8' width='250' height='38' rx='4' fill='#f2f2f2' stroke='#bbb'/>")
        body.append(svg.text(x, 24, name, 12, anchor="middle", weight="bold"))
        body.append(svg.text(x, 39, detail, 10.5, svg.GREY, anchor="middle"))
        body.append(svg.line(x, 46, x, height - 30, "#bbb", 1))
    body.append(svg.text(8, 28, "ms", 10.5, svg.GREY))
    row_y: dict[tuple, list[float]] = {}
    for row, y in zip(rows, ys):
        body.append(svg.text(8, y + 4, f"+{(row.time_ns - t0) / 1e6:.1f}", 10.5, svg.GREY))
        body.extend(_arrow(row, y))
        for j, (note, colour) in enumerate(row.notes):
            body.append(svg.text(NOTES_X, y + 4 + 12 * j - 6 * (len(row.notes) - 1), svg.shorten(note, 68), 10.5,
                                 colour))
        if row.key is not None:
            row_y.setdefault(row.key, []).append(y)
    # A held request or a copy sent later: a bar on the proxy lane from its arrival to its delivery.
    for spans in row_y.values():
        if len(spans) > 1 and spans[-1] - spans[0] > ROW:
            x = LANES["proxy"]
            body.append(f"<rect x='{x - 4}' y='{spans[0]:.0f}' width='8' height='{spans[-1] - spans[0]:.0f}'"
                        f" fill='{svg.ORANGE}' opacity='0.55'/>")
            body.append(svg.text(x - 8, spans[-1] - 8, "held", 10, svg.ORANGE, anchor="end"))
    footer = ("solid: the client's own requests; dashed orange: a copy the proxy made; red: delivered into another"
              " broker-side transaction than the client's")
    if hidden:
        footer = f"{hidden} more row(s) not drawn; " + footer
    body.append(svg.text(8, height - 10, footer, 10, svg.GREY))
    return svg.document(WIDTH, height, body, title, "wire-diagram")
