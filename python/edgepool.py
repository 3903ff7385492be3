"""edgepool from Python: load phases, statistics, trim and the memory budget of a process running on
edgepool (``LD_PRELOAD=.../libedgepool.so python3 ...``). Pure Python, through ctypes; nothing to build.

    import edgepool
    with edgepool.load_phase() as phase:
        session = onnxruntime.InferenceSession(path)
    print(phase.report.peak_bytes, phase.report.released_bytes)
    print(edgepool.stats()["os_bytes"])
    edgepool.trim()
    edgepool.set_limit(256 << 20)
"""
import ctypes
import dataclasses
import errno
import os

__all__ = ["PhaseReport", "load_phase", "stats", "trim", "set_limit", "check", "version", "NotPreloaded"]


class NotPreloaded(RuntimeError):
    """libedgepool.so is not part of this process."""


_lib = None


def _edgepool():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(None)  # the preloaded library's symbols are the process's
        if not hasattr(lib, "edgepool_version"):
            raise NotPreloaded(
                "libedgepool.so is not loaded in this process: run Python with "
                "LD_PRELOAD=/path/to/libedgepool.so (LD_PRELOAD is now "
                f"{os.environ.get('LD_PRELOAD', 'unset')!r})"
            )
        lib.edgepool_version.restype = ctypes.c_char_p
        lib.edgepool_trim.restype = ctypes.c_size_t
        lib.edgepool_check.restype = ctypes.c_long
        lib.edgepool_set_limit.argtypes = [ctypes.c_size_t]
        lib.edgepool_prefault_free.argtypes = [ctypes.c_size_t]
        lib.edgepool_prefault_free.restype = ctypes.c_size_t
        lib.edgepool_load_end.argtypes = [ctypes.POINTER(_ReportC)]
        lib.edgepool_stats.argtypes = [ctypes.POINTER(_StatsC), ctypes.c_size_t]
        if hasattr(lib, "edgepool_class_stats"):  # an older library has none
            lib.edgepool_class_stats.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _lib = lib
    return _lib


class _ReportC(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "allocations", "peak_bytes", "survivor_bytes", "released_bytes",
        "os_bytes_before", "os_bytes_after", "duration_ns")]


# struct edgepool_stats (cdylib/include/edgepool.h): fields only ever join at its end.
_STATS_FIELDS = (
    "os_bytes", "peak_os_bytes", "committed_bytes", "free_bytes", "dirty_free_bytes", "slab_bytes",
    "limit_bytes", "slabs_acquired", "slabs_released", "slab_refills", "remote_frees", "large_allocs",
    "large_frees", "large_realloc_in_place", "direct_allocs", "direct_frees", "direct_bytes", "purges",
    "purged_bytes", "caches_created", "caches_adopted", "caches_abandoned", "arena_chunks_released",
    "budget_refusals", "oom_refusals", "lock_contended", "lock_wait_ns", "run_cache_hits", "run_cache_bytes",
    "os_mmap_calls", "os_munmap_calls", "os_madvise_calls", "os_mprotect_calls", "os_mremap_calls", "page_faults",
    "live_bytes", "in_use_bytes", "peak_in_use_bytes", "large_bytes", "moved_bytes",
)
_CLASS_FIELDS = ("size", "slots_in_use", "slots_reserved", "allocations", "frees")


class _ClassC(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in _CLASS_FIELDS]


class _StatsC(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint64)] + [(n, ctypes.c_uint64) for n in _STATS_FIELDS]


@dataclasses.dataclass(frozen=True)
class PhaseReport:
    """What a load phase did (see the README's "Load and run phases")."""
    allocations: int
    peak_bytes: int
    survivor_bytes: int
    released_bytes: int
    os_bytes_before: int
    os_bytes_after: int
    duration_ns: int


class load_phase:
    """A process-wide load phase for the ``with`` block; ``.report`` holds its report afterwards."""

    def __init__(self):
        self.report = None

    def __enter__(self):
        _edgepool().edgepool_load_begin()
        return self

    def __exit__(self, *exc):
        r = _ReportC()
        if _edgepool().edgepool_load_end(ctypes.byref(r)) != 0:
            raise OSError(errno.EINVAL, "edgepool_load_end: no load phase is open")
        self.report = PhaseReport(*(getattr(r, n) for n, _ in _ReportC._fields_))
        return False


def stats():
    """Statistics now, as a dict (the figures of ``EDGEPOOL_STATS=1``): ints, ``fragmentation`` (a
    fraction) and ``classes``, a list of dicts, one per size class (slots in use, reserved, their
    utilisation, allocations and frees)."""
    s = _StatsC()
    if _edgepool().edgepool_stats(ctypes.byref(s), ctypes.sizeof(s)) != 0:
        raise OSError(ctypes.get_errno(), "edgepool_stats failed")
    filled = (s.size - 8) // 8  # an older library fills fewer fields
    d = {n: getattr(s, n) for n in _STATS_FIELDS[:filled]}
    if "live_bytes" in d:
        d["fragmentation"] = 1 - min(d["live_bytes"], d["os_bytes"]) / d["os_bytes"] if d["os_bytes"] else 0.0
    lib = _edgepool()
    if hasattr(lib, "edgepool_class_stats"):
        n = lib.edgepool_class_stats(None, 0)
        arr = (_ClassC * n)()
        lib.edgepool_class_stats(arr, n)
        d["classes"] = [
            dict({f: getattr(c, f) for f in _CLASS_FIELDS},
                 utilisation=c.slots_in_use / c.slots_reserved if c.slots_reserved else 0.0)
            for c in arr
        ]
    return d


def trim():
    """Returns every free heap page to the OS; returns the bytes."""
    return _edgepool().edgepool_trim()


def check():
    """Debug mode (EDGEPOOL_DEBUG=1): checks the canary of every live block and the fill of every
    quarantined one; returns how many live blocks it checked, or None when debug mode is off. A damaged
    block is reported on stderr with the last allocator events, and the process aborts."""
    n = _edgepool().edgepool_check()
    return None if n < 0 else n


def prefault_free(nbytes):
    """Faults in `nbytes` of edgepool's free memory (and keeps it resident), so that the first
    inference after loading takes no page faults for that much; returns the bytes made resident."""
    return _edgepool().edgepool_prefault_free(nbytes)


def set_limit(nbytes):
    """Sets the memory budget in bytes (0 = none): requests beyond it fail (MemoryError in Python)."""
    _edgepool().edgepool_set_limit(nbytes)


def version():
    return _edgepool().edgepool_version().decode()
