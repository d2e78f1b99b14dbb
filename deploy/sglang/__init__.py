"""What deployctl knows about SGLang itself, pure (no I/O): the launch argv rules (argv.py)."""
