# SIMULATED stand-in (deployctl sandbox TEST DOUBLE) shaped like sglang's srt/models/qwen2.py.
from torch import nn


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, config, quant_config=None, prefix: str = ""):
        super().__init__()
        self.capture_aux_hidden_states = False

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.capture_aux_hidden_states = True
        self.model.layers_to_capture = [val + 1 for val in layer_ids or []]


EntryClass = Qwen2ForCausalLM
