"""A stand-in for SGLang's ``sgl_kernel`` on a CPU without its native CPU build: a test fixture only.

Why: in CPU mode (``SGLANG_USE_CPU_ENGINE=1``) SGLang 0.5.23 imports a few ``*_cpu`` ops from
``sgl_kernel`` at import time, and the kernel wheels on the package index hold CUDA code only, which
fails to load without a GPU driver. Of those ops, the tiny-model lane calls exactly one,
``assign_req_to_token_pool_cpu``, on every prefill and decode; it is written here in plain torch.
Every other name resolves (so the imports succeed) to a function that raises when called, so a code
path this stand-in does not cover fails loudly instead of computing something wrong. On an SGLang
upgrade, re-check ``grep -rn "from sgl_kernel import"`` in its wheel.
"""

from __future__ import annotations

from typing import Any, NoReturn

__version__ = "0.0.0+genrm-cpu-stand-in"


def assign_req_to_token_pool_cpu(req_pool_indices: Any, req_to_token: Any, start_offset: Any,
                                 end_offset: Any, out_cache_loc: Any, pool_len: int) -> None:
    """Write each request's new KV-cache slots into its row of the request-to-token table.

    Request ``r`` (in order) owns the next ``end - start`` entries of ``out_cache_loc``; they go to
    ``req_to_token[req_pool_indices[r], start:end]``, which is what SGLang's Triton kernel of the same
    name does on a GPU. ``pool_len`` (the table's row length) only bounds the GPU kernel's blocks.
    """
    del pool_len
    rows = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    taken = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        length = end - start
        req_to_token[row, start:end] = out_cache_loc[taken:taken + length].to(req_to_token.dtype)
        taken += length


def _missing(name: str) -> Any:
    def refuse(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise NotImplementedError(f"sgl_kernel.{name} is not in the CPU stand-in (hack/sglang_engine)")

    refuse.__name__ = name
    return refuse


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(name)
