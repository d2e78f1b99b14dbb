"""Fleets: SGLang's router in front of replicas, rolling redeploys, multi-node servers, built on
run-level phases (phases.py). Nothing is imported here: callers import the module they use
(``deploy.fleet.plan``'s printers, ``deploy.fleet.rollout``), inside the verb that needs it, so
``deployctl --help`` loads no SSH library."""
