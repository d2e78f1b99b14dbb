"""SIMULATED safetensors (deployctl sandbox TEST DOUBLE): ``safetensors.torch.load_file`` for the sender."""
