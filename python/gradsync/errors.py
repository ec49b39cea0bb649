"""gradsync's errors as Python exceptions, one class per status code."""

OK = 0
_NAMES = {
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
    6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
    10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE",
    15: "DATA_LOSS", 16: "UNAUTHENTICATED", 100: "PENDING",
}


class GradsyncError(RuntimeError):
    """A failed gradsync call. `code` is the status code (absl/gRPC numbering),
    `code_name` its name; the message is gradsync's own (it names the rank and
    the op where it knows them)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.code_name = _NAMES.get(code, str(code))

    def __str__(self) -> str:
        return f"{self.code_name}: {self.args[0]}"


class InvalidArgument(GradsyncError, ValueError):
    """A bad argument, found before anything ran (code 3)."""


class DeadlineExceeded(GradsyncError, TimeoutError):
    """A wait or an op ran past its deadline (code 4). Also a `TimeoutError`, and
    its text says " Timed out " as torch's callers (and torch's own tests) match
    a timeout (` (Timed out|closed|timeout) `); gradsync's message (which rank,
    which op) follows."""

    def __str__(self) -> str:
        return f"{self.code_name}: Timed out at the op's deadline: {self.args[0]}"


class StillRunning(DeadlineExceeded):
    """A wait ran out while the op is still running (C API GS_PENDING, 100): it
    goes on; wait again. A DeadlineExceeded that is not a StillRunning is the
    op's own deadline."""

    def __str__(self) -> str:
        return f"{self.code_name}: Timed out waiting; the op goes on: {self.args[0]}"


class FailedPrecondition(GradsyncError):
    """The call does not fit the state (a closed session, say; code 9)."""


class Aborted(GradsyncError):
    """The op was aborted, e.g. a rank or a daemon failed (code 10)."""


class Unavailable(GradsyncError, ConnectionError):
    """The daemon (or a peer) cannot be reached (code 14)."""


# The C API's GS_PENDING: a wait ran out, the op goes on.
PENDING = 100

_CLASSES = {3: InvalidArgument, 4: DeadlineExceeded, 9: FailedPrecondition, 10: Aborted,
            14: Unavailable, PENDING: StillRunning}


def error(code: int, message: str) -> GradsyncError:
    """The exception for `code` with `message`."""
    return _CLASSES.get(code, GradsyncError)(code, message)
