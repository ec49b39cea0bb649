"""What the torch backend uses of torch beyond its public API, in one place:
the version-specific glue. Tested with torch 1.13 (Debian 12's python3-torch);
a newer torch changes these first.

  * profiler events (`record_async`): torch.autograd._record_function_with_args_enter
    and torch.ops.profiler._call_end_callbacks_on_jit_fut, as c10d's own RPC
    records async work (1.13 has no public API for an event that ends on
    another thread);
  * backend registration (`register_backend`): 1.13's
    Backend.register_backend(name, func); 2.x adds `extended_api` and
    `devices`, which gradsync does not need;
  * c10d's group bookkeeping (`default_group`, `default_store`, `group_ranks`,
    `rank_not_in_group`): private functions of distributed_c10d;
  * `REDUCE_OPS`: ReduceOp.AVG exists from 1.11 (NCCL only in torch);
    PREMUL_SUM's factor (torch._make_nccl_premul_sum) is not readable from
    Python in 1.13, so the backend refuses PREMUL_SUM, naming why;
  * monitored_barrier: 1.13's dist.monitored_barrier refuses every backend but
    gloo, so gradsync offers gradsync.torch.monitored_barrier; a newer torch
    calls the group's own monitored_barrier method, which the backend has.
  * storages (`storage_of`, `storage_ref`, `storage_expired`,
    `free_storage_ref`): a tensor's untyped storage (1.13: TypedStorage's
    _untyped(); 2.x: Tensor.untyped_storage()) and its weak references
    (UntypedStorage._weak_ref / _expired / _free_weak_ref, what
    torch.multiprocessing uses), for the storages shared in place.
"""

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

TESTED_TORCH = "1.13"

REDUCE_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.PRODUCT: "prod",
              dist.ReduceOp.MIN: "min", dist.ReduceOp.MAX: "max"}
if hasattr(dist.ReduceOp, "AVG"):
    REDUCE_OPS[dist.ReduceOp.AVG] = "avg"


def profiler_enabled() -> bool:
    return torch.autograd._profiler_enabled()


def record_async(name: str, inputs, fut: torch.futures.Future) -> torch.futures.Future:
    """Starts profiler event `name` (with the inputs' shapes) now and ends it
    when `fut` completes, on whichever thread completes it; returns the
    future of that end."""
    handle = torch.autograd._record_function_with_args_enter(name, *inputs)
    return torch.ops.profiler._call_end_callbacks_on_jit_fut(handle, fut)


def register_backend(name: str, create) -> None:
    """Registers `create(store, rank, size, timeout)` as backend `name`, once
    per process."""
    if not hasattr(dist.Backend, name.upper()):
        dist.Backend.register_backend(name, create)


def default_group():
    return c10d._get_default_group()


def default_store():
    return c10d._get_default_store()


def group_ranks(pg):
    """The global ranks of group `pg` (None for the default group)."""
    return c10d._pg_group_ranks.get(pg)


def rank_not_in_group(group) -> bool:
    return c10d._rank_not_in_group(group)


def storage_of(t: torch.Tensor):
    """The untyped storage holding `t`'s elements."""
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage()
    return t.storage().untyped()


def storage_ref(storage) -> int:
    """A weak reference to `storage` (free it with free_storage_ref)."""
    return storage._weak_ref()


def storage_expired(ref: int) -> bool:
    return torch.UntypedStorage._expired(ref)


def free_storage_ref(ref: int) -> None:
    torch.UntypedStorage._free_weak_ref(ref)
