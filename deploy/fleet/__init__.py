"""Fleets: SGLang's router in front of replicas, rolling redeploys, run-level phases."""
