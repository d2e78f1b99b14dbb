"""SIMULATED sglang.srt (deployctl sandbox TEST DOUBLE): stand-in model sources, read as text by the doctor and the stand-in server."""
