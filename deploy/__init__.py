"""deployctl: take a trained EAGLE-3 drafter to a verified, benchmarked SGLang server."""

__version__ = "0.1.0"
