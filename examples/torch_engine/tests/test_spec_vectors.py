"""The engine's weights and tokens generator reproduces docs/spec.md §2.4's test vectors."""
import torch

from ced_torch import config, weights

EMBED_SEED1 = [-0.71487354684649784, -0.076212974805412476, -0.20082720789162581, 1.3356397097977246]
TINY_TOKENS_SEED2 = [40, 62, 55, 19, 80, 7, 71, 93, 66, 56, 93, 25, 85, 54, 96, 52, 6, 90, 66, 18]


def vector_problems(generate_tensor, token_stream) -> list[str]:
    tiny, out = config.builtin("tiny"), []
    if generate_tensor(1, "embed", (4,), 0.0, 3.0**0.5).tolist() != EMBED_SEED1:
        out.append("embed[0..3], weight seed 1")
    if generate_tensor(1, "layers.0.attn_norm", (2,), 1.0, 0.1).tolist() != [1.0984661189262428, 0.90072025125921384]:
        out.append("layers.0.attn_norm[0..1]")
    if token_stream(tiny, 20, 2) != TINY_TOKENS_SEED2:
        out.append("tiny tokens, seed 2")
    if token_stream(tiny, 8, 0) != [64, 68, 72, 7, 68, 29, 5, 15]:
        out.append("tiny tokens, seed 0")
    return out


def test_generator_reproduces_the_spec_test_vectors_to_the_last_digit():
    assert weights.splitmix64(0) == 0xE220A8397B1DCDAF and weights.fnv1a64("embed") == 0x0B0E48B4160DCA6E
    assert vector_problems(weights.generate_tensor, weights.token_stream) == []
    # an f32 model rounds each double to the nearest float (§2.1)
    tiny = weights.generate(config.builtin("tiny"), 1)
    want = torch.tensor([-0.21532483066406277, -0.078054622983584981], dtype=torch.float64).float()
    assert torch.equal(tiny["layers.1.wq_a"].view(-1)[:2], want)


def test_vector_check_fails_on_an_off_by_one_generator():
    shifted = lambda seed, name, shape, c, s: weights.generate_tensor(seed + 1, name, shape, c, s)  # noqa: E731
    assert "embed[0..3], weight seed 1" in vector_problems(shifted, weights.token_stream)
    assert vector_problems(weights.generate_tensor, lambda cfg, n, seed: weights.token_stream(cfg, n, seed + 1)) != []
