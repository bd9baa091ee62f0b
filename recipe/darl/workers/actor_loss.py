"""The D-ARL loss as a verl actor loss function (`actor_wg.set_loss_fn`), shaped like verl's `ppo_loss`.

The policy term is `core.darl_policy_loss` over the [batch, response_length] fields the driver adds (BATCH_KEYS:
`core.LossInputs.batch_fields`).
`darl_token_coef` is normalized over the global mini-batch, so the micro-batch loss is a plain sum times dp_size.
"""

from __future__ import annotations

from tensordict import TensorDict
from verl.trainer.ppo.core_algos import agg_loss, kl_penalty
from verl.utils.metric import AggregationType, Metric
from verl.workers.config import ActorConfig
from verl.workers.utils.padding import no_padding_2_padding

from ..core.loss import darl_policy_loss
from ..core.step import LossInputs

BATCH_KEYS = tuple(LossInputs.PREFIX + name for name in LossInputs.FIELDS)


def darl_loss(
    config: ActorConfig, model_output, data: TensorDict, dp_group=None, *, threshold: float, stop_grad: bool,
    behavior_clip: tuple[float, float] | None = None,
):
    """verl loss function: returns (loss, metrics) for one micro-batch."""
    missing = [k for k in BATCH_KEYS if k not in data.keys()]
    if missing:
        raise KeyError(f"darl_loss: the batch lacks {missing}; the D-ARL trainer must put them there")
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    entropy = model_output.get("entropy", None)
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data)

    dp_size = data["dp_size"]
    config.global_batch_info["dp_size"] = dp_size
    config.global_batch_info["batch_num_tokens"] = data["batch_num_tokens"]
    config.global_batch_info["global_batch_size"] = data["global_batch_size"]
    config.global_batch_info["loss_scale_factor"] = config.loss_scale_factor

    fields = ["response_mask", "old_log_probs", "advantages", *BATCH_KEYS]
    if "ref_log_prob" in data:
        fields.append("ref_log_prob")
    data = data.select(*fields).to_padded_tensor()
    response_mask = data["response_mask"].to(bool)

    pg_sum, stats = darl_policy_loss(
        log_prob=log_prob, old_log_prob=data["old_log_probs"], advantages=data["advantages"],
        response_mask=response_mask, threshold=threshold, clip_ratio_c=config.get("clip_ratio_c", 3.0),
        stop_grad=stop_grad, behavior_clip=behavior_clip,
        **{name: data[LossInputs.PREFIX + name] for name in LossInputs.FIELDS},
    )
    # token_coef sums to 1 over the global mini-batch; FSDP averages gradients over dp ranks
    pg_loss = pg_sum * dp_size
    keep = stats["keep"]
    kept = keep.sum().clamp(min=1)
    metrics = Metric.from_dict({
        "actor/pg_clipfrac": stats["clipped"].sum() / kept,
        "actor/ppo_kl": -(stats["neg_approx_kl"] * keep).sum() / kept,
        "actor/behavior_clipfrac": stats["behavior_clipped"].sum() / kept,
        "actor/rho_bar_mean": (stats["rho_bar"] * keep).sum() / kept,
    }, aggregation=AggregationType.MEAN)
    metrics["actor/pg_loss"] = Metric(value=pg_loss, aggregation=AggregationType.SUM)
    policy_loss = pg_loss

    if entropy is not None:
        entropy_loss = agg_loss(
            loss_mat=entropy, loss_mask=response_mask, loss_agg_mode=config.loss_agg_mode, **config.global_batch_info
        )
        policy_loss = policy_loss - config.entropy_coeff * entropy_loss
        metrics["actor/entropy_loss"] = Metric(value=entropy_loss, aggregation=AggregationType.SUM)

    if config.use_kl_loss:
        kld = kl_penalty(logprob=log_prob, ref_logprob=data["ref_log_prob"], kl_penalty=config.kl_loss_type)
        kl_loss = agg_loss(
            loss_mat=kld, loss_mask=response_mask, loss_agg_mode=config.loss_agg_mode, **config.global_batch_info
        )
        policy_loss = policy_loss + kl_loss * config.kl_loss_coef
        metrics["kl_loss"] = Metric(value=kl_loss, aggregation=AggregationType.SUM)
        metrics["kl_coef"] = config.kl_loss_coef

    return policy_loss, metrics
