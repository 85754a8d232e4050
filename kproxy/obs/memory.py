"""The process's own view of its memory: CPython's small-object arenas and glibc's heap.

RSS says how much memory the process holds, not which allocator holds it or
whether it is in use. A soak's growth (docs/reliability.md, "Memory through
a soak") could be told apart only with these figures: pymalloc's arenas
(1 MiB each, mapped apart from the heap, returned only when empty) and
glibc's arenas (the main heap and one per thread that allocated).
Served by the admin API at `/debug/memory`; reading them walks every
pymalloc pool and glibc's free chunks, a few milliseconds of the loop's
time (20 ms measured with a heap of 400,000 blocks), so a soak asks every
10 s and peeks at the requests held alone (`?held`) in between.
"""

from __future__ import annotations

import ctypes
import gc
import re
import sys
from typing import Any

_STAT_LINE = re.compile(r"^# ([a-z ]+?)\s+=\s+([\d,]+)$", re.MULTILINE)
_UNUSED_POOLS = re.compile(r"^(\d+) unused pools \* (\d+) bytes", re.MULTILINE)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.open_memstream.restype = ctypes.c_void_p
        libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t)]
        libc.fclose.argtypes = [ctypes.c_void_p]
        libc.free.argtypes = [ctypes.c_void_p]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def pymalloc_stats_text() -> str:
    """What `sys._debugmallocstats()` prints to stderr, as a string ('' where it cannot be had)."""
    if _LIBC is None or not hasattr(ctypes.pythonapi, "_PyObject_DebugMallocStats"):
        return ""
    buf, size = ctypes.c_char_p(), ctypes.c_size_t()
    stream = _LIBC.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not stream:
        return ""
    dump = ctypes.pythonapi._PyObject_DebugMallocStats
    dump.argtypes, dump.restype = [ctypes.c_void_p], ctypes.c_int
    try:
        dump(stream)  # called with the GIL held (pythonapi): no thread allocates meanwhile
    finally:
        _LIBC.fclose(stream)
    try:
        return ctypes.string_at(buf, size.value).decode("ascii", "replace")
    finally:
        _LIBC.free(ctypes.cast(buf, ctypes.c_void_p))


def pymalloc_figures(text: str | None = None) -> dict[str, int]:
    """pymalloc's arena counts and bytes: `arenas_allocated_current`, `bytes_in_allocated_blocks`, ..."""
    text = pymalloc_stats_text() if text is None else text
    figures = {m[1].replace(" ", "_"): int(m[2].replace(",", "")) for m in _STAT_LINE.finditer(text)
               if not m[1].startswith("arena map")}
    if unused := _UNUSED_POOLS.search(text):
        figures["bytes_in_unused_pools"] = int(unused[1]) * int(unused[2])
    return figures


def glibc_figures() -> dict[str, int]:
    """glibc's `mallinfo2` over all its arenas: bytes in use, free in its arenas, and mapped apart."""
    if _LIBC is None or not hasattr(_LIBC, "mallinfo2"):
        return {}
    _LIBC.mallinfo2.restype = _Mallinfo2
    info = _LIBC.mallinfo2()
    return {"arena_bytes": info.arena, "in_use_bytes": info.uordblks, "free_bytes": info.fordblks,
            "free_chunks": info.ordblks, "mmapped_bytes": info.hblkhd, "mmapped_chunks": info.hblks}


_HEAP = re.compile(r'<heap nr="(\d+)">(.*?)</heap>', re.DOTALL)
_HEAP_FREE = re.compile(r'<total type="(?:fast|rest)" count="\d+" size="(\d+)"/>')
_HEAP_SIZE = re.compile(r'<system type="current" size="(\d+)"/>')


def glibc_heaps() -> list[dict[str, int]]:
    """Each glibc arena (0 is the main heap, the others threads'): its size from the system and its free bytes."""
    if _LIBC is None or not hasattr(_LIBC, "malloc_info"):
        return []
    buf, size = ctypes.c_char_p(), ctypes.c_size_t()
    stream = _LIBC.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not stream:
        return []
    _LIBC.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    try:
        _LIBC.malloc_info(0, stream)
    finally:
        _LIBC.fclose(stream)
    try:
        text = ctypes.string_at(buf, size.value).decode("ascii", "replace")
    finally:
        _LIBC.free(ctypes.cast(buf, ctypes.c_void_p))
    heaps = []
    for match in _HEAP.finditer(text):
        body = match[2]
        current = _HEAP_SIZE.search(body)
        heaps.append({"nr": int(match[1]), "system_bytes": int(current[1]) if current else 0,
                      "free_bytes": sum(int(n) for n in _HEAP_FREE.findall(body))})
    return heaps


def memory_figures() -> dict[str, Any]:
    """Both allocators' figures and the count of blocks CPython has handed out."""
    return {"pymalloc": pymalloc_figures(), "glibc": glibc_figures(), "glibc_heaps": glibc_heaps(),
            "allocated_blocks": sys.getallocatedblocks(), "gc": gc_figures()}


def gc_figures() -> dict[str, Any]:
    """The cycle collector's counts: objects waiting in each generation, and collections and objects collected."""
    stats = gc.get_stats()
    return {"count": list(gc.get_count()), "collections": [s["collections"] for s in stats],
            "collected": [s["collected"] for s in stats], "frozen": gc.get_freeze_count()}


def object_counts(top: int = 40) -> dict[str, int]:
    """The types with the most objects the cycle collector tracks (containers, not bytes or str).

    A walk of every tracked object: tens of milliseconds on the loop, for debugging only.
    """
    from collections import Counter

    counts = Counter(type(o).__qualname__ for o in gc.get_objects())
    return dict(counts.most_common(top))


def traced_lines(top: int = 40) -> list[list[Any]]:
    """[file:line, bytes, blocks] of the lines holding the most memory, when tracemalloc runs; else []."""
    import tracemalloc

    if not tracemalloc.is_tracing():
        return []
    stats = tracemalloc.take_snapshot().statistics("lineno")
    return [[str(s.traceback[0]), s.size, s.count] for s in stats[:top]]


def return_freed_memory() -> float:
    """Hand the pages glibc holds free back to the system (`malloc_trim(0)`); returns the seconds it took.

    glibc returns freed memory to the system only from the top of its heaps,
    so the pages a peak of requests left free in the middle stay resident.
    They are reused for later allocations of any size, but RSS keeps the
    peak's height; trimming lets it follow what is in use. Nothing is moved:
    the pages are dropped (MADV_DONTNEED) and come back zeroed when touched.
    """
    if _LIBC is None or not hasattr(_LIBC, "malloc_trim"):
        return 0.0
    import time

    started = time.perf_counter()
    _LIBC.malloc_trim(ctypes.c_size_t(0))
    return time.perf_counter() - started
