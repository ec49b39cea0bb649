"""ctypes bindings of libgradsync.so's C API (client/c_api.h). Internal."""

import ctypes
import ctypes.util
import os
import pathlib
import threading

c_int, c_int32, c_int64, c_uint32, c_uint64, c_size_t, c_char_p, c_void_p = (
    ctypes.c_int, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint32, ctypes.c_uint64,
    ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p)


class SessionOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("job_id", c_char_p),
        ("world_size", c_int32),
        ("rank", c_int32),
        ("timeout_ms", c_int64),
        ("heartbeat_timeout_ms", c_int64),
        ("op_timeout_ms", c_int64),
        ("tcp_streams", c_int32),
        ("algorithm", c_char_p),
        ("timeline", c_int32),
        ("ps_shards", c_int32),
        ("client_name", c_char_p),
        ("tenant_token", c_char_p),
        ("codec", c_char_p),
    ]


class CollectiveSpec(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("kind", c_int32),
        ("buffer", c_void_p),
        ("offset_bytes", c_size_t),
        ("count", c_size_t),
        ("dtype", c_int32),
        ("op", c_int32),
        ("root", c_int32),
        ("name", c_char_p),
        ("algorithm", c_char_p),
        ("timeout_ms", c_int64),
        ("tag", c_int32),
        ("premul_factor", ctypes.c_double),
        ("codec", c_char_p),
    ]


class OpInfo(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("algorithm", ctypes.c_char * 16),
                ("queued_us", c_int64), ("run_us", c_int64), ("source", c_int32)]


def _candidates():
    env = os.environ.get("GRADSYNC_LIB")
    if env:
        yield env
    here = pathlib.Path(os.path.abspath(__file__)).parent
    # The wheel's own copy (scripts/build-wheel.sh).
    yield str(here / "_lib" / "libgradsync.so")
    recorded = here / "_libpath.txt"
    if recorded.exists():
        yield recorded.read_text().strip()
    # A source checkout: python/gradsync next to bazel-bin/sdk.
    for up in (here.parent.parent, here.parent.parent.parent):
        yield str(up / "bazel-bin" / "sdk" / "libgradsync.so")
    found = ctypes.util.find_library("gradsync")
    if found:
        yield found


_lib = None
_lock = threading.Lock()


def lib():
    """The loaded library, with every prototype declared (loaded once)."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in _candidates():
            tried.append(path)
            if not os.path.exists(path) and "/" in path:
                continue
            try:
                loaded = ctypes.CDLL(path)
                break
            except OSError as e:
                tried[-1] = f"{path} ({e})"
        else:
            raise ImportError(
                "gradsync: cannot find libgradsync.so (set GRADSYNC_LIB, install the wheel of "
                "scripts/build-wheel.sh, or install the SDK with scripts/install-sdk.sh); tried: " + ", ".join(tried))
        _declare(loaded)
        _lib = loaded
        return _lib


def _declare(l):
    P = ctypes.POINTER
    protos = {
        "gs_last_error": (c_char_p, []),
        "gs_client_connect": (c_int, [c_char_p, c_int64, P(c_void_p)]),
        "gs_client_free": (None, [c_void_p]),
        "gs_session_options_init": (None, [P(SessionOptions)]),
        "gs_session_open_with": (c_int, [c_void_p, P(SessionOptions), P(c_void_p)]),
        "gs_session_rank": (c_int, [c_void_p]),
        "gs_session_world_size": (c_int, [c_void_p]),
        "gs_session_close": (c_int, [c_void_p]),
        "gs_buffer_alloc": (c_int, [c_void_p, c_size_t, P(c_void_p)]),
        "gs_buffer_register_fd": (c_int, [c_void_p, c_int, c_uint64, c_size_t, P(c_void_p)]),
        "gs_buffer_adopt": (c_int, [c_void_p, c_void_p, c_size_t, P(c_void_p), P(c_size_t)]),
        "gs_buffer_alloc_device": (c_int, [c_void_p, c_size_t, c_int, P(c_void_p)]),
        "gs_buffer_register_device": (c_int, [c_void_p, c_void_p, c_size_t, P(c_void_p)]),
        "gs_buffer_cuda_device": (c_int, [c_void_p]),
        "gs_buffer_data": (c_void_p, [c_void_p]),
        "gs_buffer_size": (c_size_t, [c_void_p]),
        "gs_buffer_free": (c_int, [c_void_p, c_void_p]),
        "gs_collective_spec_init": (None, [P(CollectiveSpec)]),
        "gs_submit": (c_int, [c_void_p, P(CollectiveSpec), P(c_uint64)]),
        "gs_op_info_init": (None, [P(OpInfo)]),
        "gs_wait_info": (c_int, [c_void_p, c_uint64, c_int64, P(OpInfo)]),
        "gs_poll_info": (c_int, [c_void_p, c_uint64, P(OpInfo)]),
        "gs_session_event_fd": (c_int, [c_void_p, P(c_int)]),
    }
    for name, (res, args) in protos.items():
        f = getattr(l, name)
        f.restype = res
        f.argtypes = args


def last_error():
    msg = lib().gs_last_error()
    return msg.decode("utf-8", "replace") if msg else ""
