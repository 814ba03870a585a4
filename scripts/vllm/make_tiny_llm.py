"""A tiny language model made here, nothing downloaded: a randomly initialised Llama of two layers
(head size 64, which vLLM's CPU attention needs) and a byte-level BPE tokenizer trained on a few
sentences, saved with transformers' save_pretrained as a Hugging Face model folder that vLLM loads,
with a chat template for chat completions.

    python scripts/vllm/make_tiny_llm.py OUT_DIR
"""

from __future__ import annotations

import sys

TEXT = [
    "What is machine learning? Machine learning is the study of programs that learn from data.",
    "The quick brown fox jumps over the lazy dog.",
    "Triton serves models over HTTP and gRPC; tritonmp serves them from worker processes.",
    "A language model predicts the next token from the tokens before it.",
] * 20
CHAT_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def main(out: str) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    tokenizer.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=512, special_tokens=special,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, torch_dtype="float32")
    LlamaForCausalLM(config).save_pretrained(out)
    print(f"tiny Llama ({sum(p.numel() for p in LlamaForCausalLM(config).parameters())} parameters, "
          f"vocabulary {len(fast)}) in {out}")


if __name__ == "__main__":
    main(sys.argv[1])
