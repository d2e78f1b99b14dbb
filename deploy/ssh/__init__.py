"""Floor 2: reaching a host (issue 25): the SSH transport, host-key trust, the agent, ssh_config reading and
evaluation, ProxyJump hops and the bounded channel reads."""
