"""SIMULATED sglang.srt.layers (deployctl sandbox TEST DOUBLE)."""
