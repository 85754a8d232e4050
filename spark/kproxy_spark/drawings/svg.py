"""The few SVG pieces the report's pictures are made of: plain text, no
library, so a picture is a few kilobytes inline in report.html and scales
with the page."""

from __future__ import annotations

from html import escape

FONT = "font-family='system-ui,sans-serif'"
RED, GREEN, GREY, ORANGE, INK = "#c1121f", "#2a9d8f", "#8d99ae", "#e76f51", "#222"


def text(x: float, y: float, content: str, size: int = 11, colour: str = INK, anchor: str = "start",
         weight: str = "normal") -> str:
    return (f"<text x='{x:.0f}' y='{y:.0f}' font-size='{size}' fill='{colour}' text-anchor='{anchor}'"
            f" font-weight='{weight}'>{escape(content)}</text>")


def line(x1: float, y1: float, x2: float, y2: float, colour: str = INK, width: float = 1.2, dashed: bool = False,
         arrow: str | None = None) -> str:
    dash = " stroke-dasharray='6 4'" if dashed else ""
    head = f" marker-end='url(#{arrow})'" if arrow else ""
    return (f"<line x1='{x1:.0f}' y1='{y1:.0f}' x2='{x2:.0f}' y2='{y2:.0f}' stroke='{colour}'"
            f" stroke-width='{width}'{dash}{head}/>")


def arrow_heads(colours: dict[str, str]) -> str:
    """<defs> with one arrow head per name -> colour (an SVG marker takes no colour from its line)."""
    heads = "".join(
        f"<marker id='{name}' viewBox='0 0 10 10' refX='9' refY='5' markerWidth='7' markerHeight='7'"
        f" orient='auto-start-reverse'><path d='M0,0 L10,5 L0,10 z' fill='{colour}'/></marker>"
        for name, colour in colours.items())
    return f"<defs>{heads}</defs>"


def document(width: float, height: float, body: list[str], title: str, css_class: str) -> str:
    return (f"<svg class='{css_class}' width='{width:.0f}' height='{height:.0f}'"
            f" viewBox='0 0 {width:.0f} {height:.0f}' role='img' {FONT}><title>{escape(title)}</title>"
            + "".join(body) + "</svg>")


def shorten(value: str, limit: int) -> str:
    """Long names (transactional ids, topics) cut in the middle, where they differ least."""
    if len(value) <= limit:
        return value
    keep = (limit - 1) // 2
    return value[:keep] + "…" + value[-(limit - 1 - keep):]
