"""What torch.cuda answers about a simulated GPU in the fake world, where there is no real one.

Fake tensors on ``cuda`` need no device, but code around them asks torch.cuda questions:
torch.distributed's broadcast asks the capability (sm90+ picks an FP8 path), FSDP2 asks the
current device and drives its own streams and events (an all-gather stream, a reduce-scatter
stream, events that order them). Here the capability is Hopper's 9.0 (the H100/H200 of the
hardware profiles), the device is 0, and streams and events are program-order no-ops: every
"stream" runs in issue order, as the CPU tracker counts memory. What that leaves out is the
caching allocator's per-stream behaviour (a block freed on one stream is reused on another
only after an event), which the fake world does not claim to measure.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch

CAPABILITY = (9, 0)


class Event:
    """A CUDA event in program order: recorded and waited on at once."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def record(self, stream: object = None) -> None:
        pass

    def wait(self, stream: object = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class Stream(Event):
    """A CUDA stream in program order: everything on it has already happened."""

    device = torch.device("cuda", 0)

    def wait_stream(self, stream: object) -> None:
        pass

    def wait_event(self, event: object) -> None:
        pass

    def record_event(self, event: Event | None = None) -> Event:
        return event or Event()


_DEFAULT = Stream()
_PATCHES = {
    "get_device_capability": lambda device=None: CAPABILITY,
    "current_device": lambda: 0,
    "Stream": Stream,
    "Event": Event,
    "current_stream": lambda device=None: _DEFAULT,
    "default_stream": lambda device=None: _DEFAULT,
    "stream": lambda stream=None: nullcontext(),
    "set_stream": lambda stream: None,
    "synchronize": lambda device=None: None,
}


@contextmanager
def simulated_gpu(device: str) -> Iterator[None]:
    """torch.cuda's answers for a simulated ``cuda`` device while inside; nothing changes for
    ``cpu`` or where a real GPU is present."""
    if device != "cuda" or torch.cuda.is_available():
        yield
        return
    real = {name: getattr(torch.cuda, name) for name in _PATCHES}
    for name, fake in _PATCHES.items():
        setattr(torch.cuda, name, fake)
    try:
        yield
    finally:
        for name, original in real.items():
            setattr(torch.cuda, name, original)
