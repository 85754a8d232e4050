"""A G0 or G1c case as a picture of its cycle, as Elle draws them: the
operations on a ring, each dependency an arrow labelled with its kind (ww:
the first wrote a value of the key before the second's in the log; wr: the
second read what the first wrote) and the key and values that make it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kproxy_spark.drawings import svg

NODE_R = 30
#: How far an arrow bends off the straight line, so a two-operation cycle shows both arrows.
BEND = 34
KIND_COLOURS = {"ww": "#457b9d", "wr": svg.RED}


def _label(step: Mapping[str, Any]) -> str:
    if step.get("type") == "wr":
        return f"wr key {step.get('key')}: read {step.get('value')}"
    return f"ww key {step.get('key')}: {step.get('value')} before {step.get('value2')}"


def cycle_svg(case: Mapping[str, Any], title: str) -> str:
    """The case's cycle as one <svg> element."""
    nodes = list((case.get("cycle") or [])[:-1])
    processes = case.get("processes") or []
    count = max(len(nodes), 1)
    radius = 70 + 28 * count
    width, height = 2 * radius + 300, 2 * radius + 110
    cx, cy = width / 2, height / 2 - 5
    # The first operation on top, the ring clockwise: the picture reads in the cycle's order.
    where = {i: (cx + radius * math.sin(2 * math.pi * i / count), cy - radius * math.cos(2 * math.pi * i / count))
             for i in range(len(nodes))}
    body = [svg.arrow_heads({f"cycle-{kind}": colour for kind, colour in KIND_COLOURS.items()})]
    for i, step in enumerate(case.get("steps") or []):
        (x1, y1), (x2, y2) = where[i], where[(i + 1) % count]
        length = math.hypot(x2 - x1, y2 - y1) or 1.0
        ux, uy = (x2 - x1) / length, (y2 - y1) / length
        # Bend to the arrow's left (outward on a clockwise ring), then start and stop at the circles' rims.
        mx, my = (x1 + x2) / 2 + uy * BEND, (y1 + y2) / 2 - ux * BEND
        start = _towards(x1, y1, mx, my, NODE_R)
        end = _towards(x2, y2, mx, my, NODE_R + 3)
        colour = KIND_COLOURS.get(step.get("type"), svg.INK)
        body.append(f"<path d='M{start[0]:.0f},{start[1]:.0f} Q{mx:.0f},{my:.0f} {end[0]:.0f},{end[1]:.0f}'"
                    f" fill='none' stroke='{colour}' stroke-width='1.6' marker-end='url(#cycle-{step.get('type')})'/>")
        lx, ly = (x1 + x2) / 2 + uy * BEND * 1.5, (y1 + y2) / 2 - ux * BEND * 1.5
        anchor = "middle" if abs(lx - cx) < 20 else ("start" if lx > cx else "end")
        body.append(svg.text(lx, ly + 4, _label(step), 11, colour, anchor))
    for i, node in enumerate(nodes):
        x, y = where[i]
        process = processes[i] if i < len(processes) else None
        body.append(f"<circle cx='{x:.0f}' cy='{y:.0f}' r='{NODE_R}' fill='#f2f2f2' stroke='#555'/>")
        body.append(svg.text(x, y - 1, f"op {node}", 11.5, anchor="middle", weight="bold"))
        if process is not None:
            body.append(svg.text(x, y + 13, f"process {process}", 9.5, svg.GREY, anchor="middle"))
    body.append(svg.text(8, height - 22, "ww: the first op's value comes before the second's in the log", 10,
                         svg.GREY))
    body.append(svg.text(8, height - 8, "wr: the second op read the first op's value", 10, svg.GREY))
    return svg.document(width, height, body, title, "cycle-diagram")


def _towards(x: float, y: float, tx: float, ty: float, distance: float) -> tuple[float, float]:
    length = math.hypot(tx - x, ty - y) or 1.0
    return x + (tx - x) / length * distance, y + (ty - y) / length * distance
