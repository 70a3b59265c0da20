"""What torch.cuda answers about a simulated GPU in the fake world, where there is no real one.

Fake tensors on ``cuda`` need no device, but code around them asks torch.cuda questions:
torch.distributed's broadcast asks the capability (sm90+ picks an FP8 path), FSDP2 asks the
current device and drives its own streams and events (an all-gather stream, a reduce-scatter
stream, events that order them). Here the capability is Hopper's 9.0 (the H100/H200 of the
hardware profiles), the device is 0, and streams and events execute in program order, as the
CPU tracker counts memory: every op has run when the next is issued. What that leaves out is
the caching allocator's per-stream behaviour (a block freed on one stream is reused on another
only after an event), which the fake world does not claim to measure.

Streams keep their identity, though: the current stream (``torch.cuda.stream(s)``), each
event's recording and each wait are reported to a listener (the step recorder,
tspbench.measure.trace), so a replay puts FSDP2's side streams on lanes of their own and orders
them as the events say.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import torch

CAPABILITY = (9, 0)
RECORD, STREAM_WAIT = 3, 4  # tspbench.core.trace's RECORD and STREAM event kinds


class Listener(Protocol):
    def stream_event(self, kind: int, stream: int, event: int) -> None: ...


_listener: Listener | None = None
_event_ids = itertools.count()
_names: list[str] = ["default"]


def set_listener(listener: Listener | None) -> None:
    global _listener
    _listener = listener


def _report(kind: int, stream: int, event: int) -> None:
    if _listener is not None:
        _listener.stream_event(kind, stream, event)


class Event:
    """A CUDA event in program order: recorded and waited on at once, each reported."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.id = next(_event_ids)

    def record(self, stream: Stream | None = None) -> None:
        _report(RECORD, (stream or _current[-1]).index, self.id)

    def wait(self, stream: Stream | None = None) -> None:
        _report(STREAM_WAIT, (stream or _current[-1]).index, self.id)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class Stream:
    """A CUDA stream in program order: everything on it has already happened."""

    device = torch.device("cuda", 0)

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.index = len(_names)
        _names.append(f"stream {self.index}")

    def wait_stream(self, stream: Stream) -> None:
        event = Event()
        event.record(stream)
        self.wait_event(event)

    def wait_event(self, event: Event) -> None:
        _report(STREAM_WAIT, self.index, event.id)

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


_DEFAULT = Stream.__new__(Stream)
_DEFAULT.index = 0
_current: list[Stream] = [_DEFAULT]


def current_stream_id() -> int:
    """The stream ops are issued on now (0: the default stream, and always on CPU)."""
    return _current[-1].index


def stream_names() -> list[str]:
    return list(_names)


@contextmanager
def _stream(stream: Stream | None = None) -> Iterator[None]:
    _current.append(stream or _current[-1])
    try:
        yield
    finally:
        _current.pop()


def _set_stream(stream: Stream) -> None:
    _current[-1] = stream


_PATCHES = {
    "get_device_capability": lambda device=None: CAPABILITY,
    "current_device": lambda: 0,
    "Stream": Stream,
    "Event": Event,
    "current_stream": lambda device=None: _current[-1],
    "default_stream": lambda device=None: _DEFAULT,
    "stream": _stream,
    "set_stream": _set_stream,
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
    del _names[1:]
    try:
        yield
    finally:
        for name, original in real.items():
            setattr(torch.cuda, name, original)
        _current[:] = [_DEFAULT]
