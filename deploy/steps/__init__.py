"""Playbook steps, one module each, in the order the up playbook runs them."""

from deploy.steps import (
    benchmark,
    doctor,
    ensure_helper,
    fix_keys,
    free_gpus,
    launch,
    stop_stale,
    verify_acceptance,
    wait_gpus_free,
    wait_ready,
)

REGISTRY = {
    module.NAME: module
    for module in (doctor, ensure_helper, fix_keys, stop_stale, free_gpus, wait_gpus_free, launch, wait_ready, verify_acceptance,
                   benchmark)
}
