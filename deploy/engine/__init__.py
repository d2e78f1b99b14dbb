"""The host-session engine: the one public API every verb that touches a host runs through.

- ``records``: ``HostReport``, ``StepRecord``, ``RunOptions``, ``RolledBack``, ``Progress``, ``launch_stamp``
  (pure data);
- ``session``: ``HostSession`` (connect, lock, run steps, roll back, read the server state, close),
  ``run_on_host`` (the whole playbook on one host), ``run_steps``, ``server_state``, ``died``,
  ``roll_back``, ``rollback_steps``, ``network_host``, ``step_context``;
- ``plan``: ``plan_playbook``, ``plan_with_endpoints``, ``describe_endpoints`` (touches nothing);
- ``run``: ``run_playbook`` (hosts in parallel), ``run_locked`` (local lock, host locks, history).

Run-level phases (rolling batches, node groups) live above it in deploy/fleet/ and use only these
names; the engine never imports the fleet. Nothing is imported here: ``deployctl --help`` loads no
SSH library.
"""
