"""Floor 2: what a host runs and where it keeps it (issue 25): the state directory layout, the SGLang argv and
the one desired deployment every verb asks (deploy/host/deployment.py)."""
