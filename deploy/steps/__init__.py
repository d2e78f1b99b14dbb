"""Playbook steps, one module each, in the order the up playbook runs them."""

from deploy.steps import (
    benchmark,
    converge,
    doctor,
    ensure_helper,
    fix_keys,
    free_gpus,
    launch,
    quarantine,
    record_good,
    regression_gate,
    same_night_control,
    stop_stale,
    swap_drafter,
    verify_acceptance,
    wait_gpus_free,
    wait_ready,
)

REGISTRY = {
    module.NAME: module
    for module in (doctor, ensure_helper, fix_keys, converge, quarantine, same_night_control, swap_drafter, stop_stale, free_gpus, wait_gpus_free, launch,
                   wait_ready, verify_acceptance, benchmark, regression_gate, record_good)
}
