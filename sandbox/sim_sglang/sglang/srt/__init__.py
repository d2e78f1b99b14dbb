"""SIMULATED sglang.srt (deployctl sandbox TEST DOUBLE): only model sources for text scans."""
