"""Knowledge distillation without the logits: a small random teacher distilled into a smaller
student with tiledlse.distillation_loss, on the CPU (or a GPU: --device cuda).

Each model is an embedding of the input tokens, a tanh layer and an output layer over a
vocabulary of V = 1000 classes; the teacher is wider (D_t = 64) than the student (D_s = 32). The
student is trained for --steps Adam steps on the forward KL between the teacher's and its own
softmax at temperature 2, mixed with a little of its cross-entropy against the teacher's argmax
(alpha), and the divergence on a held-out batch is printed. Neither model's logits (tokens x V)
are ever formed: the loss takes the hidden states and the output layers' weights.

    python3 examples/python/distill.py [--steps 50] [--device cpu] [--dtype float32]

Exit status 0 when the held-out divergence fell to less than half its first value.
"""
import argparse

import torch

import tiledlse

VOCAB, INPUTS, D_TEACHER, D_STUDENT = 1000, 256, 64, 32


class Model(torch.nn.Module):
    """tokens -> tanh(W embed(tokens)) -> the hidden states; `head` maps them to the vocabulary."""

    def __init__(self, width, scale=1.0):
        super().__init__()
        self.embed = torch.nn.Embedding(INPUTS, width)
        self.mix = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, VOCAB, bias=False)
        with torch.no_grad():
            self.head.weight.mul_(scale)

    def hidden(self, tokens):
        return torch.tanh(self.mix(self.embed(tokens)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    # A teacher with a peaked softmax (its head scaled up), frozen; a student from scratch.
    teacher = Model(D_TEACHER, scale=20.0).to(args.device, dtype).requires_grad_(False)
    student = Model(D_STUDENT).to(args.device, dtype)
    optimizer = torch.optim.Adam(student.parameters(), lr=2e-2)
    options = dict(divergence="forward_kl", temperature=2.0)

    def loss_on(tokens, alpha=0.0):
        with torch.no_grad():
            teacher_hidden = teacher.hidden(tokens)
            # The teacher's most likely class as the hard label (a real run has the data's next token).
            # (Formed here for the example only: 512 x 1000.)
            labels = (teacher_hidden @ teacher.head.weight.T).argmax(-1) if alpha > 0 else None
        return tiledlse.distillation_loss(student.hidden(tokens), student.head.weight, teacher_hidden,
                                          teacher.head.weight, labels, alpha=alpha, **options)

    g = torch.Generator().manual_seed(1)
    held_out = torch.randint(0, INPUTS, (8, 64), generator=g).to(args.device)
    with torch.no_grad():
        first = loss_on(held_out).item()
    print("step 0: held-out divergence %.4f" % first)
    for step in range(1, args.steps + 1):
        tokens = torch.randint(0, INPUTS, (8, 64), generator=g).to(args.device)
        loss = loss_on(tokens, alpha=0.1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 0 or step == args.steps:
            with torch.no_grad():
                print("step %d: training loss %.4f, held-out divergence %.4f" % (step, loss.item(),
                                                                                 loss_on(held_out).item()))
    with torch.no_grad():
        last = loss_on(held_out).item()
    if not last < 0.5 * first:
        raise SystemExit("the divergence did not fall enough: %.4f -> %.4f" % (first, last))
    print("divergence fell from %.4f to %.4f in %d steps" % (first, last, args.steps))


if __name__ == "__main__":
    main()
