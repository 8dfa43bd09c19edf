"""hoop_comm_stats through ctypes: what a communicator measured of its calls and its peers, and
the rendezvous server's last word on which ranks come late (hoop(3), "Finding the slow rank")."""

import ctypes as _c

from ._lib import _lib

_COLLS = 10  # HOOP_STATS_COLLS


class _CollStats(_c.Structure):
    _fields_ = [("calls", _c.c_uint64), ("bytes", _c.c_uint64), ("time_s", _c.c_double),
                ("waited_s", _c.c_double)]


class _Stats(_c.Structure):
    _fields_ = [("since_s", _c.c_double), ("calls", _c.c_uint64), ("bytes", _c.c_uint64),
                ("in_calls_s", _c.c_double), ("waited_s", _c.c_double),
                ("wait_share", _c.c_double), ("colls", _CollStats * _COLLS),
                ("slowest_rank", _c.c_int), ("slowest_late_s", _c.c_double),
                ("late_calls", _c.c_uint), ("reporting", _c.c_int), ("view_age_s", _c.c_double),
                ("slowest_link_from", _c.c_int), ("slowest_link_to", _c.c_int),
                ("slowest_link_goodput", _c.c_double)]


class _PeerStats(_c.Structure):
    _fields_ = [("rank", _c.c_int), ("late_median_s", _c.c_double), ("late_p99_s", _c.c_double),
                ("late_max_s", _c.c_double), ("waited_s", _c.c_double),
                ("bytes_sent", _c.c_uint64), ("bytes_received", _c.c_uint64),
                ("goodput", _c.c_double)]


_lib.hoop_comm_stats_sized.argtypes = [_c.c_void_p, _c.POINTER(_Stats), _c.c_size_t,
                                       _c.POINTER(_PeerStats), _c.c_size_t, _c.c_int]
_lib.hoop_stats_coll_name.restype = _c.c_char_p
_lib.hoop_stats_coll_name.argtypes = [_c.c_int]
_NAMES = [_lib.hoop_stats_coll_name(i).decode() for i in range(_COLLS)]


def _late(seconds):
    return None if seconds < 0 else seconds


def comm_stats(handle, size, check):
    """A dict of hoop_comm_stats' figures for the communicator handle of size ranks; check
    raises for a result that is not HOOP_OK."""
    stats = _Stats()
    peers = (_PeerStats * size)()
    check(_lib.hoop_comm_stats_sized(handle, _c.byref(stats), _c.sizeof(_Stats), peers,
                                     _c.sizeof(_PeerStats), size))
    colls = {}
    for i, name in enumerate(_NAMES):
        c = stats.colls[i]
        if c.calls:
            colls[name] = {"calls": c.calls, "bytes": c.bytes, "time_s": c.time_s,
                           "waited_s": c.waited_s}
    return {
        "since_s": stats.since_s, "calls": stats.calls, "bytes": stats.bytes,
        "in_calls_s": stats.in_calls_s, "waited_s": stats.waited_s,
        "wait_share": stats.wait_share, "colls": colls,
        "slowest_rank": None if stats.slowest_rank < 0 else stats.slowest_rank,
        "slowest_late_s": stats.slowest_late_s if stats.slowest_rank >= 0 else None,
        "late_calls": stats.late_calls, "reporting": stats.reporting,
        "view_age_s": _late(stats.view_age_s),
        "slowest_link": (stats.slowest_link_from, stats.slowest_link_to,
                         stats.slowest_link_goodput) if stats.slowest_link_goodput > 0 else None,
        "peers": [{"rank": p.rank, "late_median_s": _late(p.late_median_s),
                   "late_p99_s": _late(p.late_p99_s), "late_max_s": _late(p.late_max_s),
                   "waited_s": p.waited_s, "bytes_sent": p.bytes_sent,
                   "bytes_received": p.bytes_received, "goodput": _late(p.goodput)}
                  for p in peers],
    }
