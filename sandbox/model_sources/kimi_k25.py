# SIMULATED stand-in (deployctl sandbox TEST DOUBLE) shaped like sglang 0.5.10+'s srt/models/kimi_k25.py: has the capture hook (PR #19689).
import torch
from torch import nn

from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM


class KimiK25VisionTower(nn.Module):
    def __init__(self, config, quant_config=None, prefix: str = ""):
        super().__init__()
        self.config = config

    def forward(self, pixel_values, grid_thws):
        return pixel_values


class KimiK25ForConditionalGeneration(nn.Module):
    def __init__(self, config, quant_config=None, prefix: str = ""):
        super().__init__()
        self.config = config
        self.vision_tower = KimiK25VisionTower(config.vision_config, quant_config)
        self.language_model = DeepseekV3ForCausalLM(config.text_config, quant_config)

    def pad_input_ids(self, input_ids, mm_inputs):
        return input_ids

    def forward(self, input_ids, positions, forward_batch, get_embedding: bool = False):
        return self.language_model(input_ids, positions, forward_batch)

    def load_weights(self, weights):
        self.language_model.load_weights(weights)

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        # PR #19689: delegate EAGLE-3 aux hidden state capture to the text model
        self.language_model.set_eagle3_layers_to_capture(layer_ids)


EntryClass = [KimiK25ForConditionalGeneration]
