"""SIMULATED sglang.srt.speculative (deployctl sandbox TEST DOUBLE)."""
