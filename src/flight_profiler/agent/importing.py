"""Whether a module's import is still running: kept apart from torch_support so that `status`
answers without importing what the torch commands need (gzip, pickle, tempfile: ~13 ms in a
target that has none of them, issue 23)."""

from __future__ import annotations


def still_importing(module: object) -> bool:
    """Whether ``module`` is in sys.modules but its import has not finished (another thread is
    running its ``__init__``): half of torch is there (``torch.Tensor``), ``torch.profiler`` or
    ``torch.cuda`` may not be yet, and reading them races with the import."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))
