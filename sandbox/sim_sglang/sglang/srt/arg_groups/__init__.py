"""SIMULATED sglang.srt.arg_groups (deployctl sandbox TEST DOUBLE): where SGLang 0.5.15+ keeps its CLI helpers."""
