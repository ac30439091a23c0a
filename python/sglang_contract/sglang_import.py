"""Imports SGLang 0.5.23's API-layer modules on a CPU-only machine.

SGLang's request/response types live in modules (``sglang.srt.managers.io_struct``, ...) whose
import chain reaches the model and kernel layers. On this CPU machine the venv has torch (the
PyPI CUDA build, which runs on CPU) but deliberately not a few packages that only those layers
use. This module makes the import work and changes nothing in the types themselves:

* ``triton``: stubbed by SGLang's *own* stub, ``sglang/_platform_stubs.py``
  (``install_platform_stubs``), which SGLang installs on Apple Silicon where triton does not
  exist. It is loaded from the installed wheel by file path and run with ``sys.platform`` seen as
  ``darwin`` and ``torch.backends.mps.is_available()`` as true *inside that call only*; its MPS
  tensor patch (``_patch_non_blocking``) is skipped. It also adds missing ``torch.mps.*``
  helpers, which nothing here uses.
* ``NOT_INSTALLED`` below (packages the checker never calls): an empty stand-in module whose
  every attribute is a harmless placeholder, with ``__version__ = "0.0.0"`` so that version
  probes (transformers) read it as too old to use. Each entry says who imports it.

Everything else is the real package from the venv. ``import_sglang()`` returns the real
``sglang`` package; it fails loudly if the installed version is not 0.5.23.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

SGLANG_VERSION = "0.5.23"

# top-level package -> the SGLang module that imports it unconditionally (not used by the checker)
NOT_INSTALLED = {
    "soundfile": "sglang/srt/entrypoints/openai/audio_chunking.py (audio decoding of /v1/audio/transcriptions)",
    "IPython": "sglang/utils.py (notebook display helpers of the frontend language)",
    "torchvision": "sglang/srt/multimodal/internvl_utils.py (image transforms of a VLM)",
}


class _Placeholder:
    """Any attribute, call, subscript or base-class use of a stand-in module yields this."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> object:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _Placeholder()

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()

    def __getitem__(self, key: object) -> object:
        return _Placeholder()

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)

    def __iter__(self):
        return iter(())

    def __bool__(self) -> bool:
        return False


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandIn(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _StandInFinder(importlib.abc.MetaPathFinder):
    """Serves a stand-in for NOT_INSTALLED packages (and their submodules) that are absent."""

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if top not in NOT_INSTALLED:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            try:
                if finder.find_spec(fullname, path, target) is not None:
                    return None  # really installed: use it
            except (ImportError, ValueError, AttributeError):
                continue
        return importlib.machinery.ModuleSpec(fullname, _StandInLoader(), is_package=True)


def _install_sglang_triton_stub(stubs_path: str) -> None:
    """Runs SGLang's own triton stub (see the module doc) when triton is not installed."""
    if "triton" in sys.modules or importlib.util.find_spec("triton") is not None:
        return
    import torch

    spec = importlib.util.spec_from_file_location("_sglang_platform_stubs", stubs_path)
    stubs = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = stubs  # its dataclasses look their module up there
    spec.loader.exec_module(stubs)
    fake_sys = types.SimpleNamespace(platform="darwin", modules=sys.modules, meta_path=sys.meta_path)
    fake_platform = types.SimpleNamespace(machine=lambda: "arm64")
    stubs.sys = fake_sys
    stubs.platform = fake_platform
    stubs._patch_non_blocking = lambda: None
    real_mps_available = torch.backends.mps.is_available
    torch.backends.mps.is_available = lambda: True
    try:
        stubs.install_platform_stubs()
    finally:
        torch.backends.mps.is_available = real_mps_available
    if "triton" not in sys.modules:
        raise RuntimeError("SGLang's triton stub did not install")


_done = False


def import_sglang() -> types.ModuleType:
    """Prepares the stubs once, then imports and returns the real ``sglang`` package."""
    global _done
    if not _done:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(
                "sglang is not installed: run `bash scripts/setup-python.sh` and use its python"
            )
        root = list(spec.submodule_search_locations)[0]
        _install_sglang_triton_stub(f"{root}/_platform_stubs.py")
        sys.meta_path.append(_StandInFinder())
        _done = True
    import sglang

    if sglang.__version__ != SGLANG_VERSION:
        raise ImportError(f"sglang {sglang.__version__} is installed; the checks need {SGLANG_VERSION}")
    return sglang
