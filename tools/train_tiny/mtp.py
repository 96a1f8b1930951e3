"""The Qwen3.5 MTP (multi-token prediction) head, built from transformers' own Qwen3.5 modules.

HF transformers does not implement the MTP head (it ignores ^mtp.* on load); this follows
vLLM/SGLang (see shared/spec/qwen3_5-detailed.md section 7):

    m  = fc(cat[pre_fc_norm_embedding(embed(x_{t+1})), pre_fc_norm_hidden(h_t)])   # embedding first
    m  = layers.0(m)        # a full-attention Qwen3_5DecoderLayer, causal over the MTP's own context,
                            # the pair (h_t, x_{t+1}) at RoPE position t
    h' = norm(m)            # -> shared lm_head gives logits for x_{t+2}; h' feeds the next chained step

h_t is the main model's hidden state AFTER model.norm (the vector lm_head reads).
State-dict names (with the "mtp." prefix added on save) are exactly the real checkpoint's.
"""
import torch
from torch import nn
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm


class Qwen3_5MTP(nn.Module):
    def __init__(self, config):
        super().__init__()
        H, eps = config.hidden_size, config.rms_norm_eps
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(H, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(H, eps=eps)
        self.fc = nn.Linear(2 * H, H, bias=False)
        # any full-attention layer index gives a full-attention layer (the index is only used by caches)
        full_idx = config.layer_types.index("full_attention")
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(config, full_idx)])
        self.norm = Qwen3_5RMSNorm(H, eps=eps)
        std = config.initializer_range
        for mod in self.modules():
            if isinstance(mod, nn.Linear):
                nn.init.normal_(mod.weight, mean=0.0, std=std)

    def forward(self, hidden, next_embeds, position_embeddings):
        """hidden: [B,T,H] post-norm main hidden h_t; next_embeds: [B,T,H] embed(x_{t+1});
        position_embeddings: (cos, sin) for positions t. Causal over T. Returns h' [B,T,H]."""
        m = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        m = self.layers[0](m, position_embeddings=position_embeddings, attention_mask=None)
        return self.norm(m)


def mtp_state_dict(mtp: Qwen3_5MTP, dtype=torch.bfloat16):
    return {f"mtp.{k}": v.detach().to(dtype).contiguous() for k, v in mtp.state_dict().items()}
