"""Every change D-ARL makes to a composed config, in one place, applied before the checks (which only read it).

- the aliases of the original D-ARL repository (verl 0.6): `algorithm.rollout_is` (bool) and
  `algorithm.rollout_is_threshold` (float) onto verl 0.9.1's `algorithm.rollout_correction`, and bypass mode's
  one-step-off default where it is null;
- DARTS's rollout manager for the one-step-off trainer when `rollout_shaping.enable=true`;
- `sdpa` for the trainer when flash-attn cannot be imported and the user chose nothing (`select_attention`): verl
  loads the models with `flash_attention_2` by default, which without `flash_attn` fails only once the workers load
  the model; verl's log-probs are then also 70-110x slower (no flash-attn cross-entropy), which the printed line says.

`apply_fixups` returns the contradictions it found and a line for each change; the entry points print the lines
(to stderr: a dry run's stdout is the resolved config).
"""

from __future__ import annotations

import importlib
from typing import Callable

from omegaconf import DictConfig, open_dict

from ..core.config import is_number
from ..trainer_mode import TrainerMode
from .config_check import SHAPING_MANAGER

VERL_DEFAULT_THRESHOLD = 2.0  # verl 0.9.1's rollout_is_threshold
ATTN_KEY = "actor_rollout_ref.model.override_config.attn_implementation"
FALLBACK_ATTN = "sdpa"


def apply_compat_aliases(cfg: DictConfig) -> list[str]:
    """Moves `algorithm.rollout_is(_threshold)` onto `algorithm.rollout_correction`; returns the contradictions."""
    problems, algo = [], cfg.algorithm
    corr = algo.rollout_correction
    alias_is, alias_thr = algo.get("rollout_is"), algo.get("rollout_is_threshold")
    if alias_is is not None:
        if not isinstance(alias_is, bool):
            problems.append(f"algorithm.rollout_is must be a bool (an alias from the original D-ARL repository), got {alias_is!r}")
        elif alias_is and corr.rollout_is not in (None, "token"):
            problems.append(f"algorithm.rollout_is=true (token-level IS) contradicts "
                            f"algorithm.rollout_correction.rollout_is={corr.rollout_is!r}")
        elif not alias_is and corr.rollout_is is not None:
            problems.append(f"algorithm.rollout_is=false contradicts algorithm.rollout_correction.rollout_is={corr.rollout_is!r}")
        elif alias_is:
            corr.rollout_is = "token"
            # in the original repository's verl, rollout_is meant IS weights from old log-probs the trainer recomputes
            if corr.get("bypass_mode") is True:
                problems.append("algorithm.rollout_is=true (decoupled IS, as in the original D-ARL repository) contradicts "
                                "algorithm.rollout_correction.bypass_mode=true; drop one of them")
            corr.bypass_mode = False
    if alias_thr is not None:
        current = corr.rollout_is_threshold
        if is_number(current) and float(current) not in (float(VERL_DEFAULT_THRESHOLD), float(alias_thr)):
            problems.append(f"algorithm.rollout_is_threshold={alias_thr} contradicts "
                            f"algorithm.rollout_correction.rollout_is_threshold={current}")
        else:
            corr.rollout_is_threshold = alias_thr
    if corr.get("bypass_mode") is None:
        corr.bypass_mode = True  # one-step-off's default
    with open_dict(algo):  # verl's AlgoConfig dataclass does not know the aliases
        algo.pop("rollout_is", None)
        algo.pop("rollout_is_threshold", None)
    return problems


def install_darts_manager(cfg: DictConfig, mode: TrainerMode) -> str | None:
    """DARTS's manager as the one-step-off or V1 trainer's rollout manager when `rollout_shaping.enable=true` and the
    user set none (the fully-async trainer installs its own in the rollouter); the line to print, or None."""
    if not (cfg.get("rollout_shaping") or {}).get("enable", False) or mode.fully_async:
        return None
    agent = cfg.actor_rollout_ref.rollout.agent
    if agent.get("agent_loop_manager_class"):
        return None  # the user's (check_config refuses any but DARTS's)
    with open_dict(agent):  # a key of verl's AgentLoopConfig that its yaml leaves out
        agent.agent_loop_manager_class = SHAPING_MANAGER
    return f"[D-ARL] config: actor_rollout_ref.rollout.agent.agent_loop_manager_class={SHAPING_MANAGER} (DARTS)"


def flash_attn_importable() -> bool:
    """True when `import flash_attn` works (a wheel built against another torch fails here too)."""
    try:
        importlib.import_module("flash_attn")
    except Exception:  # ImportError, or an undefined symbol of a build against another torch (OSError)
        return False
    return True


def select_attention(cfg: DictConfig, importable: Callable[[], bool] = flash_attn_importable) -> str | None:
    """Sets `sdpa` when flash-attn is missing and the user did not choose; returns the line to print, or None.
    A user's own choice is kept (with a warning for flash_attention_2 when flash_attn cannot be imported)."""
    model = cfg.actor_rollout_ref.model
    chosen = (model.get("override_config") or {}).get("attn_implementation")
    if chosen is not None:
        if chosen == "flash_attention_2" and not importable():
            return (f"[D-ARL] warning: {ATTN_KEY}=flash_attention_2 was set, but flash_attn cannot be imported: "
                    "the trainer's workers will fail to load the model (docs/install.md, 'GPU machine')")
        return None
    if importable():
        return None
    with open_dict(model):
        if model.get("override_config") is None:
            model.override_config = {}
        model.override_config.attn_implementation = FALLBACK_ATTN
    return (f"[D-ARL] flash_attn cannot be imported: using attn_implementation={FALLBACK_ATTN} for the trainer "
            f"(install flash-attn==2.8.3, docs/install.md, 'GPU machine', or set ++{ATTN_KEY}=... to choose); "
            "without it verl also computes log-probs one token at a time: 0.75 s instead of 0.007 s per 8192 tokens "
            "on an H100 (docs/performance.md, 'Measured on an H100')")


def apply_fixups(cfg: DictConfig, mode: TrainerMode,
                 importable: Callable[[], bool] = flash_attn_importable) -> tuple[list[str], list[str]]:
    """Applies every fix-up to `cfg` for the trainer `mode`: (contradictions found on the way, lines saying what
    changed)."""
    aliases = [k for k in ("rollout_is", "rollout_is_threshold") if cfg.algorithm.get(k) is not None]
    problems = apply_compat_aliases(cfg)
    corr = cfg.algorithm.rollout_correction
    mapped = (f"[D-ARL] config: algorithm.{', algorithm.'.join(aliases)} (the original repository's) -> "
              f"algorithm.rollout_correction.rollout_is={corr.rollout_is}, rollout_is_threshold="
              f"{corr.rollout_is_threshold}, bypass_mode={corr.bypass_mode}") if aliases else None
    lines = [mapped, install_darts_manager(cfg, mode), select_attention(cfg, importable)]
    return problems, [line for line in lines if line]
