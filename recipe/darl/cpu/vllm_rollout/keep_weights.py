"""vLLM plugin (entry point ``vllm.general_plugins: darl_cpu_keep_weights``, setup.py): on CPU, keep each linear
layer's weight after vLLM packs it, so that verl can load new weights into it at every weight sync.

On CPU, vLLM's `UnquantizedLinearMethod.process_weights_after_loading` packs every linear weight for oneDNN (or its
small-GEMM kernel) and then replaces the parameter by an empty tensor (``dispatch_cpu_unquantized_gemm(layer,
remove_weight=True)``). The first weight sync from the trainer then fails: ``Attempted to load weight ... into
parameter (torch.Size([0]))``. With this plugin the call keeps the parameter (``remove_weight=False``, what vLLM
itself does for embeddings); verl's worker extension calls vLLM's ``process_weights_after_loading`` after every
sync, which re-packs from the freshly loaded weights. Cost: the linear weights are held twice (packed and plain).

vLLM calls `register` in each of its processes (API server, engine core, workers). It changes nothing unless
``VERL_PLATFORM=cpu`` (the project's CPU platform, recipe/darl/cpu/platform.py), and the function it wraps is
called only on vLLM's CPU platform. Idempotent.
"""

from __future__ import annotations

import functools
import logging
import os

logger = logging.getLogger(__name__)


def register() -> None:
    # the test of recipe.darl.cpu.platform.is_requested, without importing verl into every vLLM process
    if os.environ.get("VERL_PLATFORM", "").strip().lower() != "cpu":
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
