"""Floor 7: the read-only verbs and sweeps the CLI calls (inspect, status, bench sweeps), above the fleet
and below the renderers."""
