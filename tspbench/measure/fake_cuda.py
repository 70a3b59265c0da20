"""Fake CUDA on a CPU-only build of torch: a 20-line C++ shim that makes autograd accept it.

FakeTensorMode fakes tensors on ``cuda`` on any build, and the forward pass of the real step
runs on them. Backward does not on a CPU-only build: the autograd engine asks the CUDA device
guard for each gradient's stream (the process aborts: "PyTorch is not linked with support for
cuda devices") and the accelerator API for the current stream ("Cannot access accelerator
device when none is available"). torch's own remedy (``_ensureCUDADeviceGuardSet``, called by
FakeTensorMode) covers CUDA builds without a GPU, not CPU-only builds.

The shim registers what a CUDA build registers, with nothing behind it: CUDA hooks that say
CUDA is built (so CUDA is the accelerator) but not available (so nothing initialises a
device), and c10's FakeGuardImpl as the CUDA device guard (streams and events are no-ops).
torch caches its CUDA hooks when it is imported, so the shim must be loaded first: the fake
world starts its worker processes with the shim in ``LD_PRELOAD`` (``preload_env``). Only
those processes ever see it; on a CUDA build nothing is needed and nothing is built.

The shim is compiled once per torch installation with the system C++ compiler ($CXX or g++,
~3 s) into the user's cache folder; without a compiler, fake CUDA training is unavailable
and says so (``--device cpu`` needs no shim).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from tspbench.core.errors import UsageError

SOURCE = r"""
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>

namespace {
// CUDA is "built" (the accelerator autograd syncs streams on) but never available.
struct FakeCUDAHooks final : at::CUDAHooksInterface {
  explicit FakeCUDAHooks(at::CUDAHooksArgs) {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return false; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
};
}  // namespace

namespace at {
C10_REGISTER_CLASS(CUDAHooksRegistry, CUDAHooks, FakeCUDAHooks)
}
C10_REGISTER_GUARD_IMPL(CUDA, c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>);
"""


def needed(device: str) -> bool:
    """Whether fake tensors on ``device`` need the shim to train: cuda on a CPU-only torch."""
    return device == "cuda" and not torch.backends.cuda.is_built()


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "tspbench"


def shim_path() -> Path:
    """The compiled shim for this torch installation, built on first use (atomically)."""
    lib = Path(torch.__file__).parent / "lib"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    key = hashlib.sha256(f"{SOURCE}{torch.__version__}{lib}{abi}".encode()).hexdigest()[:12]
    target = cache_dir() / f"fake_cuda_{key}.so"
    if target.is_file():
        return target
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise UsageError(
            "fake CUDA training on a CPU-only torch build needs a C++ compiler (g++, or $CXX) to build a "
            "small shim; install one, use --device cpu, or a CUDA build of torch"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    include = Path(torch.__file__).parent / "include"
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        source, built = Path(tmp) / "fake_cuda.cpp", Path(tmp) / "fake_cuda.so"
        source.write_text(SOURCE)
        command = [
            compiler, "-shared", "-fPIC", "-O1", "-std=c++17", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            f"-I{include}", str(source), f"-L{lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}",
            "-o", str(built),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise UsageError(
                f"building the fake CUDA shim failed ({' '.join(command[:2])} ...): {done.stderr[-500:]}"
            )
        os.replace(built, target)  # atomic: concurrent builders each install a complete file
    return target


def preload_env(device: str) -> dict[str, str]:
    """Environment additions for a process that will run fake tensors on ``device``."""
    if not needed(device):
        return {}
    preload = [str(shim_path()), *filter(None, os.environ.get("LD_PRELOAD", "").split(":"))]
    return {"LD_PRELOAD": ":".join(preload)}


def active() -> bool:
    """Whether this process runs with the shim (CUDA counts as the accelerator, none is there)."""
    return torch._C._accelerator_getAccelerator() is not None and not torch.cuda.is_available()
