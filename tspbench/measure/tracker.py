"""Peak memory of a measured region, per rank, with a breakdown by category.

CUDA: the caching allocator's peaks (allocated and reserved), reset per window, with the
categories at the peak from the dispatch tracker below, run beside it (``CudaPeak`` in
tspbench.measure.memory_report, which also holds the MemoryReport both give).

CPU: a dispatch-level tracker, exact for what it sees. Every op's output storages (issued in
the thread that entered the tracker) are recorded by storage
identity (not data pointer: 0 for every fake storage) with their bytes; a weakref
finalizer subtracts them when the storage dies. Views share their base's storage and are
counted once; a storage an op reallocates in place (``resize_``, an ``out=`` argument) is
counted again at its new size, and so is one resized through ``UntypedStorage.resize_``, which
bypasses the dispatcher (FSDP2 frees and re-allocates gathered weights with it). Wrapper
subclasses (DTensor) count as the local tensors they hold, and their ops as the local ops they
desugar into, so memory that lives and dies inside one DTensor op counts too. What existed before the region
(parameters, gradients, optimizer state, inputs) is registered first. Not seen: storages
created in another thread (the dispatch mode is per thread; tspbench's steps allocate in one),
scratch a kernel allocates and frees inside one op (e.g. ~600 KB inside one CPU flash-attention
call), and memory a backend allocates privately (gloo's buffers).

Categories at the peak:
    parameters   registered model parameters
    gradients    their .grad tensors (registered, or adopted when autograd accumulates them)
    optimizer    registered optimizer state
    activations  tensors saved for backward (seen by a saved-tensors hook, or alive when the
                 caller marks the end of the forward pass)
    kv_cache     a decode run's key/value cache (registered: tspbench.model.cache.KVCache)
    other        everything else: transient working buffers, communication buffers, logits,
                 inputs

The tracker sees storages die when their last reference goes, whichever thread drops it: gloo's
worker thread can hold a finished collective's buffer a moment after the program let go, so the
same step can peak differently from run to run (seen: 40 identical TP-4 prefill steps peaked at
4,162,824 B in most and 4,687,112 B, +12.6%, in 1-7 of them). A peak is therefore one step's,
not a constant: bench records the spread over several steps. NCCL's watchdog holds buffers the
same way on GPUs.

An optional simulated capacity makes the CPU tracker raise ``torch.OutOfMemoryError`` when the
live total would exceed it, so out-of-memory handling is testable exactly as on a GPU.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager

import torch
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    is_traceable_wrapper_subclass_type,
)
from torch.utils._pytree import tree_leaves

from tspbench.core.names import CATEGORIES
from tspbench.dist import comm
from tspbench.measure.memory_report import MemoryReport
from tspbench.measure.storages import optimizer_state_tensors, storage_key, storages, written_tensors

_DEVICE = torch.ops.prim.device.default
# A storage seen again under another category moves only along these edges: parameters and
# optimizer state never move (autograd saves weight views too), a saved buffer can become a
# gradient (AccumulateGrad adopts it), anything uncategorised can become either, or the KV
# cache (allocated inside a decode run, then registered).
PROMOTIONS = {"other": ("activations", "gradients", "kv_cache"), "activations": ("gradients",)}


class MemoryTracker(TorchDispatchMode):
    """Live-bytes accounting of tensor storages created inside ``with tracker:`` (in this thread).

    Use ``register`` for what exists before, ``track_autograd`` around forward/backward so saved
    tensors and new gradients get their category, and ``mark_activations`` after the forward.
    """

    def __init__(self, capacity_bytes: int | None = None) -> None:
        super().__init__()
        self.capacity_bytes = capacity_bytes
        self.live = 0
        self.peak = 0
        self.totals = dict.fromkeys(CATEGORIES, 0)
        self.peak_totals = dict(self.totals)
        self.peak_phase = ""
        self.phase_peaks: dict[str, int] = {}
        self.peak_seq = 0  # allocation number of the storage that set the peak
        self._seq = 0
        self._entries: dict[int, list] = {}  # storage key -> [nbytes, category, finalizer, number]
        self._fake_mode: object = None  # the FakeTensorMode active on entry (the fake world's)

    # ---- bookkeeping
    def _add(self, storage: torch.UntypedStorage, category: str) -> None:
        nbytes = storage.nbytes()
        if nbytes == 0:
            return
        ptr = storage_key(storage)
        entry = self._entries.get(ptr)
        if entry is not None:
            if category in PROMOTIONS.get(entry[1], ()):
                self._move(entry, category)
            return
        finalizer = weakref.finalize(storage, self._free, ptr)
        finalizer.atexit = False
        self._seq += 1
        self._entries[ptr] = [nbytes, category, finalizer, self._seq]
        self.live += nbytes
        self.totals[category] += nbytes
        phase = comm.current_phase()
        if self.live > self.phase_peaks.get(phase, 0):
            self.phase_peaks[phase] = self.live
        if self.live > self.peak:
            self.peak = self.live
            self.peak_totals = dict(self.totals)
            self.peak_phase = phase
            self.peak_seq = self._seq
        if self.capacity_bytes is not None and self.live > self.capacity_bytes:
            raise torch.OutOfMemoryError(
                f"simulated device capacity exceeded: {self.live:,} bytes live after allocating "
                f"{nbytes:,} bytes, capacity {self.capacity_bytes:,} bytes"
            )

    def _move(self, entry: list, category: str) -> None:
        """Recategorise a live storage. If it was alive at the last peak, the peak's breakdown
        moves too: a tensor is what it turned out to be (a gradient adopted by autograd, a buffer
        saved for backward), even when that is known only after the peak-setting allocation."""
        nbytes, old = entry[0], entry[1]
        self.totals[old] -= nbytes
        self.totals[category] += nbytes
        if entry[3] <= self.peak_seq:
            self.peak_totals[old] -= nbytes
            self.peak_totals[category] += nbytes
        entry[1] = category

    def _free(self, ptr: int) -> None:
        entry = self._entries.pop(ptr, None)
        if entry is not None:
            self.live -= entry[0]
            self.totals[entry[1]] -= entry[0]

    def _forget(self, key: int) -> str | None:
        """Drop the entry of storage ``key`` without waiting for its storage to die (it was reallocated);
        its category, or None if it was not tracked."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        entry[2].detach()
        self.live -= entry[0]
        self.totals[entry[1]] -= entry[0]
        return entry[1]

    def _resize_storage(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        """``storage.resize_(nbytes)``, accounted: the old allocation dies, a new one is born.

        FSDP2 frees an unsharded parameter by resizing its storage to zero and re-allocates it
        the same way before the next all-gather; ``UntypedStorage.resize_`` bypasses the
        dispatcher, so the tracker wraps it while active (as torch.distributed._tools.mem_tracker
        does). A storage keeps its category across a resize; one re-allocated from zero starts
        uncategorised.
        """
        category = self._forget(storage_key(storage))
        self._original_resize(storage, nbytes)
        if nbytes:
            self._add(storage, category or "other")

    def __enter__(self) -> MemoryTracker:
        self._fake_mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
        self._staging = comm.staging()  # gloo's late releases never touch the program's tensors
        self._staging.__enter__()
        self._original_resize = torch.UntypedStorage.resize_
        tracker = self

        def resize_(storage: torch.UntypedStorage, nbytes: int) -> None:
            tracker._resize_storage(storage, nbytes)

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        torch.UntypedStorage.resize_ = self._original_resize  # type: ignore[method-assign]
        self._staging.__exit__(*exc)
        super().__exit__(*exc)

    def classify(self, tensor: Tensor, category: str) -> None:
        """Count ``tensor``'s storage under ``category`` (adding it if unseen)."""
        for s in storages(tensor):
            self._add(s, category)

    def register(self, tensors: Iterable[Tensor], category: str) -> None:
        for t in tensors:
            if isinstance(t, Tensor):
                self.classify(t, category)

    def register_model(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        params = list(model.parameters())
        self.register(params, "parameters")
        self.register((p.grad for p in params if p.grad is not None), "gradients")
        if optimizer is not None:
            self.register(optimizer_state_tensors(optimizer), "optimizer")

    def mark_activations(self) -> None:
        """Everything still uncategorised is kept for backward: call at the end of the forward pass."""
        for entry in self._entries.values():
            if entry[1] == "other":
                self._move(entry, "activations")

    def reset_peak(self) -> None:
        self.peak = self.live
        self.peak_totals = dict(self.totals)
        self.peak_phase = comm.current_phase()
        self.phase_peaks = {}
        self.peak_seq = self._seq

    def report(self) -> MemoryReport:
        return MemoryReport(
            self.peak, dict(self.peak_totals), None, "cpu-dispatch", self.peak_phase, dict(self.phase_peaks)
        )

    @contextmanager
    def track_autograd(self, model: nn.Module) -> Iterator[None]:
        """Classify saved-for-backward tensors as activations and new .grad tensors as gradients."""

        def pack(t: Tensor) -> Tensor:
            self.classify(t, "activations")
            return t

        handles = [
            p.register_post_accumulate_grad_hook(lambda p: self.classify(p.grad, "gradients"))
            for p in model.parameters()
            if p.requires_grad
        ]
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                yield
        finally:
            for h in handles:
                h.remove()

    def _reallocated(self, storage: torch.UntypedStorage) -> None:
        """An op reallocated a storage in place (``resize_``, an ``out=`` op): drop its old entry
        and count it again at its new size, in the same category."""
        self._add(storage, self._forget(storage_key(storage)) or "other")

    # ---- dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE:  # half of all calls under fake tensors: a device query allocates nothing
            return func(*args, **(kwargs or {}))
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            # A DTensor op: let the subclass desugar it into local ops, each of which comes back
            # here - so what it allocates and frees on the way (redistribution buffers,
            # loss_parallel's float32 logits, AdamW's temporaries) is counted, and its output
            # once, as the local tensor it wraps (as torch's CommDebugMode sees DTensor's comms).
            return NotImplemented
        if FakeTensor in types and any(self._shape_inference(t) for t in tree_leaves(args)):
            return func(*args, **(kwargs or {}))  # DTensor's placement inference: no memory
        if func.namespace == "c10d":  # a collective allocates nothing: it returns its arguments
            return func(*args, **(kwargs or {}))
        written = [
            (s, s.data_ptr(), s.nbytes()) for t in written_tensors(func, args, kwargs) for s in storages(t)
        ]
        out = func(*args, **(kwargs or {}))
        for storage, ptr, nbytes in written:
            if storage.data_ptr() != ptr or storage.nbytes() != nbytes:
                self._reallocated(storage)
        for t in (out,) if isinstance(out, Tensor) else tree_leaves(out):
            if isinstance(t, Tensor) and not self._shape_inference(t):
                for s in storages(t):
                    self._add(s, "other")
        return out

    def _shape_inference(self, t: Tensor) -> bool:
        """Whether ``t`` is a fake tensor of someone else's FakeTensorMode: DTensor infers an op's
        output placement by running it on fake tensors of its own, which hold no memory. (Under
        the fake world's own FakeTensorMode every tensor is fake, and each counts.)"""
        return isinstance(t, FakeTensor) and t.fake_mode is not self._fake_mode


@contextmanager
def tracked(
    model: nn.Module, optimizer: torch.optim.Optimizer | None = None, capacity_bytes: int | None = None
) -> Iterator[MemoryTracker]:
    """A CPU tracker over the block with the model and optimizer registered."""
    tracker = MemoryTracker(capacity_bytes)
    with ExitStack() as stack:
        stack.enter_context(tracker)
        tracker.register_model(model, optimizer)
        tracker.reset_peak()
        yield tracker
