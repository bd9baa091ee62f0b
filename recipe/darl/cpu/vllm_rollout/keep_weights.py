"""vLLM plugin ``darl_cpu_keep_weights`` (``vllm.general_plugins``, setup.py): with ``VERL_PLATFORM=cpu`` vLLM's CPU
linear layers keep their weight after packing it for oneDNN, so that every weight sync can load into it.

vLLM alone replaces the packed weight by an empty tensor (``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``)
and the first sync fails: ``Attempted to load weight ... into parameter (torch.Size([0]))``. Here the call keeps it
(``remove_weight=False``, as vLLM does for embeddings) and verl's worker extension re-packs after every sync; the
linear weights are held twice. vLLM calls `register` in each of its processes; idempotent.
"""

from __future__ import annotations

import functools
import logging

from recipe.darl.cpu import is_requested

logger = logging.getLogger(__name__)


def register() -> None:
    if not is_requested():
        return
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "_darl_keep_weights", False):
        return

    @functools.wraps(original)
    def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool):
        return original(layer, remove_weight=False)

    dispatch_cpu_unquantized_gemm._darl_keep_weights = True
    # vLLM's linear layers import the function from this module at call time
    utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm
    logger.debug("darl: vLLM CPU linear layers keep their weights after packing (weight sync)")
