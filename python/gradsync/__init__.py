"""gradsync: gradient synchronization through the local gradsyncd.

    import gradsync
    client = gradsync.Client()                 # $GRADSYNC_DAEMON or unix:/run/gradsync/gradsyncd.sock
    with client.open_session("job-1", world_size=4, rank=r) as s:
        grads = s.empty(1 << 20, "float32")    # numpy array in shared memory (no copies)
        grads[:] = ...
        s.allreduce(grads, op="avg").wait()    # in place; raises GradsyncError on failure

Collectives: allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall, gather, scatter
and barrier, each returning a Work (wait(timeout), done()). Element types
f32, f64, f16, bf16, i32, i64, u8; reduce ops sum, avg, min, max, prod and premul_sum (each rank's
factor: `factor=`).
Arrays come from Session.empty / empty_tensor or views of a Buffer
(Session.alloc). Errors are GradsyncError subclasses carrying gradsync's
message (which rank, which op) and code. The library is libgradsync.so
(scripts/install-sdk.sh installs it with this package; GRADSYNC_LIB overrides).
See docs/python.md.
"""

from .errors import (Aborted, DeadlineExceeded, FailedPrecondition, GradsyncError,
                     InvalidArgument, StillRunning, Unavailable)
from .session import (COLLECTIVES, DTYPES, OPS, POINT_TO_POINT, Buffer, Client, Result, Session, Work,
                      dtype_name)

__all__ = [
    "Client", "Session", "Buffer", "Work", "Result", "GradsyncError", "InvalidArgument",
    "DeadlineExceeded", "StillRunning", "FailedPrecondition", "Aborted", "Unavailable", "DTYPES",
    "OPS",
    "COLLECTIVES", "POINT_TO_POINT", "dtype_name",
]
