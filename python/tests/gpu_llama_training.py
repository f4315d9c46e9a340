"""Trains a small Llama-style model (random init) for 20 steps on CUDA in bf16 with its loss computed by
TiledLSE (tiledlse.causal_lm_loss: no logits), and at every step also computes the model's own
loss (`model(input_ids, labels=labels).loss`, which forms the logits) on the same weights and
batch as the reference. Prints both per step; fails unless they agree within bf16 rounding and
the loss decreases. Run by python/test_wheel_gpu.sh against the installed wheel; needs
transformers and a GPU. Not collected by pytest (the name does not start with test_).

    python gpu_llama_training.py [--steps 20]
"""
import argparse
import math
import sys

import torch
import transformers

import tiledlse

# Relative tolerance between the two losses: the model's loss rounds each logit to bf16 (2^-8
# relative) before its float32 cross-entropy, TiledLSE accumulates the products in float32; over
# a vocabulary of 32000 the difference stays near 1e-3 (docs/data/python_gpu_h100_2026-12-06.txt:
# at most 9.5e-4 in the Trainer runs). 1e-2 leaves room and still catches a wrong loss.
RTOL = 1e-2


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu to try the script without a GPU")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_llama_training: torch sees no GPU")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=688,
                                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                                      max_position_embeddings=512, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).to(device=args.device, dtype=torch.bfloat16)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    # A fixed batch, so that 20 steps must lower its loss (the model memorizes it); a few
    # positions ignored, as padding would be.
    input_ids = torch.randint(0, config.vocab_size, (4, 256), device=args.device)
    labels = input_ids.clone()
    labels[:, -16:] = -100
    print("Llama-style model: %d layers, hidden %d, V = %d, bf16 on %s; transformers %s, torch %s, tiledlse %s at %s"
          % (config.num_hidden_layers, config.hidden_size, config.vocab_size, torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
             transformers.__version__, torch.__version__, tiledlse.__version__, tiledlse.library_path))
    losses, worst = [], 0.0
    for step in range(args.steps):
        with torch.no_grad():
            reference = model(input_ids=input_ids, labels=labels).loss.float().item()
        optimizer.zero_grad(set_to_none=True)
        loss = tiledlse.causal_lm_loss(model, input_ids=input_ids, labels=labels)
        loss.backward()
        optimizer.step()
        value = loss.float().item()
        difference = abs(value - reference) / abs(reference)
        worst = max(worst, difference)
        print("step %2d  tiledlse %.5f  model %.5f  relative difference %.1e" % (step, value, reference, difference))
        if not (math.isfinite(value) and difference <= RTOL):
            sys.exit("FAILED at step %d: tiledlse's loss %r and the model's %r differ by more than %g"
                     % (step, value, reference, RTOL))
        losses.append(value)
    if not losses[-1] < 0.95 * losses[0]:
        sys.exit("FAILED: the loss did not decrease: %.5f at the first step, %.5f at the last" % (losses[0], losses[-1]))
    print("gpu_llama_training: %d steps, loss %.4f -> %.4f, largest relative difference to the model's loss %.1e: PASSED"
          % (len(losses), losses[0], losses[-1], worst))


if __name__ == "__main__":
    main()
