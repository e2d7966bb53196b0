"""torch's own rendezvous, sealed: what init_process_group, gloo and NCCL write to the gang's
store and read from it to bootstrap (peers' addresses and pair ids, NCCL's unique id, barrier
keys) opens only when a member of the gang wrote it.

A rank's `dist.init_process_group()` (env://, the default: Lightning, Fabric, Accelerate and
the HF Trainer call it so) reaches node 0's store through torch's own env:// handler, then
through a store of ours around it (install). Each value set through it is sealed private under
the attempt's secret for its key and the gang's round (sealed.seal_private); each value read
opens only under that seal. A value that does not open is waited past for TAMPER_WAIT_S (the
member's own write replaces a value planted before it), then the rank fails with
TorchDistributedStoreTampered instead of connecting where it points. Keys go under a prefix of
the round (naming.torch_key_prefix): a round never reads what a stopped round wrote.

Counters (store.add) cannot be sealed: their value is the store's own arithmetic. torch uses
them only to count arrivals; a forged count can make a barrier wait or pass early, never make
a rank connect elsewhere or unpickle anything.
"""

import importlib
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Sequence, Tuple

from ..core import naming, sealed
from ..core.errors import TorchDistributedStoreTampered
from .control import read_now

if TYPE_CHECKING:  # torch is imported when a rank installs the seal, not with this module
    from torch.distributed import Store

# Seconds a rank waits for a value that does not open to be replaced by a member's own.
TAMPER_WAIT_S = 10.0
_POLL_S = 0.05
# torch's registry of init_method schemes (torch/distributed/rendezvous.py): its env:// handler
# is wrapped in place, as register_rendezvous_handler refuses a scheme twice.
_HANDLERS = "_rendezvous_handlers"
# Each store of ours that torch holds: torch keeps the C++ side of a Python store only, so its
# Python side must be kept alive here, or torch's calls into it find no method.
_LIVE: List["Store"] = []


def install(step_name: str, secret: str, gang_id: str, round_: int) -> None:
    """(In a rank, before its body runs.) Every env:// rendezvous of this process goes through
    a sealed store of the attempt `gang_id` and its round `round_`."""
    module = importlib.import_module("torch.distributed.rendezvous")
    handlers = getattr(module, _HANDLERS)
    torch_env = getattr(handlers["env"], "torch_distributed_wraps", handlers["env"])

    def sealed_env(url: str, **kwargs: Any) -> Iterator[Tuple["Store", int, int]]:
        for store, rank, world_size in torch_env(url, **kwargs):
            yield sealed_store(store, step_name, secret, gang_id, round_), rank, world_size

    sealed_env.torch_distributed_wraps = torch_env  # type: ignore[attr-defined]
    handlers["env"] = sealed_env


def sealed_store(inner: "Store", step_name: str, secret: str, gang_id: str,
                 round_: int) -> "Store":
    """`inner` (node 0's store, as torch's env:// handler connected to it) behind the seal."""
    from torch.distributed import Store

    prefix = naming.torch_key_prefix(round_)
    context = "%s/round/%d" % (gang_id, round_)
    seal = sealed.PrivateSeal(secret)

    class SealedStore(Store):
        """torch's Store interface over `inner`: keys under the round's prefix, values sealed."""

        def __init__(self, store: "Store") -> None:
            super().__init__()
            self._inner = store

        def _key(self, key: str) -> str:
            return prefix + key

        def _seal(self, key: str, value: Any) -> bytes:
            data = value.encode() if isinstance(value, str) else bytes(value)
            return seal.seal(context, self._key(key), data)

        def set(self, key: str, value: Any) -> None:
            # torch's stub says str; the store takes bytes as well (and keeps them as they are)
            self._inner.set(self._key(key), self._seal(key, value))  # type: ignore[arg-type]

        def get(self, key: str) -> bytes:
            inner_key = self._key(key)
            deadline: Optional[float] = None
            while True:
                value = self._value(inner_key)
                payload = seal.open(context, inner_key, value)
                if payload is not None:
                    return payload
                sealed.IGNORED.note("torch rendezvous", inner_key, value)
                now = time.monotonic()
                deadline = now + TAMPER_WAIT_S if deadline is None else deadline
                if now >= deadline:
                    raise tampered(step_name, key, value)
                time.sleep(_POLL_S)

        def _value(self, inner_key: str) -> bytes:
            """The value under `inner_key`, waiting for it as torch's get does (within the
            store's timeout). torch waits for a key before it gets it, so one request usually
            answers (control.read_now). Where the key is absent, it is waited for and looked
            for with check: the libuv store (torch >= 2.8 here) ends every wait for a key when
            anyone reads it with compare_set, present or not, and its get of an absent key
            answers b"". A read of an absent key here would so end the other ranks' waits for
            the same peer record, and their reads end this one's, until the peer writes it."""
            value = read_now(self._inner, inner_key)
            while value is None:
                self._inner.wait([inner_key])
                if self._inner.check([inner_key]):
                    value = read_now(self._inner, inner_key)
            return value

        def add(self, key: str, amount: int) -> int:
            return int(self._inner.add(self._key(key), amount))

        def check(self, keys: Sequence[str]) -> bool:
            return bool(self._inner.check([self._key(k) for k in keys]))

        def wait(self, keys: Sequence[str], timeout: Optional[timedelta] = None) -> None:
            # Never a read here (see _value): the wait may end early, where another client
            # read an absent key; the get that follows waits on (_value).
            inner_keys = [self._key(k) for k in keys]
            if timeout is None:
                self._inner.wait(inner_keys)
            else:
                self._inner.wait(inner_keys, timeout)

        def delete_key(self, key: str) -> bool:
            return bool(self._inner.delete_key(self._key(key)))

        def num_keys(self) -> int:
            return int(self._inner.num_keys())

        def set_timeout(self, timeout: timedelta) -> None:
            super().set_timeout(timeout)
            self._inner.set_timeout(timeout)

        def multi_get(self, keys: Sequence[str]) -> List[bytes]:
            return [self.get(k) for k in keys]

        def multi_set(self, keys: Sequence[str], values: Sequence[Any]) -> None:
            for key, value in zip(keys, values):
                self.set(key, value)

        def clone(self) -> "Store":
            # Store.clone (torch >= 2.6; NCCL's watchdog clones its store): torch's stub lacks it
            return _keep(SealedStore(self._inner.clone()))  # type: ignore[attr-defined]

        def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
            raise _unsealable("compare_set")

        def append(self, key: str, value: Any) -> None:
            raise _unsealable("append")

    return _keep(SealedStore(inner))


def _keep(store: "Store") -> "Store":
    _LIVE.append(store)
    return store


def _unsealable(operation: str) -> NotImplementedError:
    return NotImplementedError(
        "the gang's rendezvous store does not offer %s: its values are sealed under the "
        "attempt's secret (docs/security.md), and torch's own rendezvous never needs it. "
        "Make a store of your own for it (torch.distributed.TCPStore, HashStore)." % operation)


def tampered(step_name: str, key: str, value: bytes) -> TorchDistributedStoreTampered:
    """The error of a rank that read a value under torch's key `key` no member wrote."""
    return TorchDistributedStoreTampered(step_name, (
        "torch's rendezvous key %s in the gang's store held a value that no rank of this gang "
        "wrote (%d bytes, still there after %.0f s): a process outside the gang writes to "
        "node 0's store port. The rank stopped rather than connect where that value points. "
        "Find what else reaches the port (on a shared host: other users' processes; remotely: "
        "the network between the nodes) and see docs/security.md."
        % (sealed.shown(key), len(value), TAMPER_WAIT_S)))
