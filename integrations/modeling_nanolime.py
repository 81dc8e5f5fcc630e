"""nanoLIMe for transformers (trust_remote_code=True): nanoLIMe's model.py, as is, in a PreTrainedModel.

integrations/export.py copies this file into an export folder, beside model.py and the relatives' files (flat:
relatives.py, ...); it runs there, as transformers' remote code, not from integrations/. Generation recomputes the
whole sequence at every step (no cache); padding (attention_mask with zeros) is refused.
"""
import os
import sys

import torch
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

_here = os.path.dirname(os.path.abspath(__file__))
_saved = {name: sys.modules.pop(name, None) for name in ("model", "relatives")}
sys.path.insert(0, _here)  # model.py imports its siblings by their plain names: these copies, not others
try:
    # relative imports: transformers copies exactly the files a remote-code module imports relatively (model.py;
    # relatives.py, which extends it as train.py builds it, and the files it imports)
    from .model import GPT, GPTConfig  # noqa: F401
    from .relatives import RelativesConfig, build_model
finally:
    sys.path.remove(_here)
    for _name, _module in _saved.items():
        sys.modules.pop(_name, None)
        if _module is not None:
            sys.modules[_name] = _module


class NanoLIMeConfig(PretrainedConfig):
    model_type = "nanolime"

    def __init__(self, nanolime=None, **kwargs):
        self.nanolime = nanolime or {}  # RelativesConfig's fields (model.GPTConfig's and the relatives')
        super().__init__(**kwargs)


class NanoLIMeForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = NanoLIMeConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]

    def __init__(self, config):
        super().__init__(config)
        self.model = build_model(RelativesConfig(**config.nanolime))
        if config.nanolime.get("tie_embeddings", True):
            self._tied_weights_keys = {"model.lm_head.weight": "model.transformer.wte.weight"}
        self.post_init()

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        model = super().from_pretrained(*args, **kwargs)
        # transformers builds the model on the meta device and loads the weights: the buffers that are not weights
        # (RoPE's tables, a fixed router) are made again here, by a model built as GPT builds itself
        device = next(model.parameters()).device
        weights, fresh = model.model.state_dict(), dict(build_model(model.model.config).named_buffers())
        for name, buffer in fresh.items():
            if name not in weights:
                owner, _, leaf = name.rpartition(".")
                model.model.get_submodule(owner)._buffers[leaf] = buffer.to(device)
        return model

    def _init_weights(self, module):
        pass  # GPT initializes itself; the weights come from model.safetensors

    def get_input_embeddings(self):
        return self.model.transformer.wte

    def get_output_embeddings(self):
        return self.model.lm_head

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("nanoLIMe models take no padding: pass one sequence, or sequences of equal length")
        # GPT.forward returns every position's logits when it is given targets (the loss is then dropped)
        logits, _ = self.model(input_ids, targets=input_ids)
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(),
                                                     ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        return {"input_ids": input_ids, "attention_mask": attention_mask}
