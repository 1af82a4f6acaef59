"""The pure parts of the words oracle (benchmarks/words_oracle.py): units placed on frames from an alignment,
the semantic first level (its index from the states, its vector the mean envelope of its frames) and the
regression's training. Tiny tensors; no model folder is read."""

from __future__ import annotations

import torch

from benchmarks.words_oracle import CODES, FirstLevels, Item, Regression, frame_units, regress, train_regression


def test_frame_units_repeat_each_unit_for_its_duration():
    alphabet: dict[str, int] = {}
    ids = frame_units({"units": "_ab_", "durations": [2, 1, 3, 1]}, 7, alphabet)
    assert ids.tolist() == [0, 0, 1, 2, 2, 2, 0]
    assert alphabet == {"_": 0, "a": 1, "b": 2}
    assert frame_units({"units": "_a_", "durations": [1, 1, 1]}, 4, alphabet) is None  # another file's frames


def test_the_semantic_level_picks_its_code_from_the_states_and_decodes_the_mean_envelope():
    torch.manual_seed(0)
    pitch = torch.zeros(CODES, 3)
    pitch[1:, 0] = 100.0  # only code 0 is near a latent with pitch 0
    states = torch.tensor([[0.0, 0.0], [10.0, 10.0]])
    frames = []
    for i in range(CODES + 200):  # two kinds of states, each with its own envelope
        s = i % 2
        frames.append((states[s] + 0.01 * torch.randn(2), torch.tensor([0.0, 1.0 + 2 * s, -s]) + 0.01 * torch.randn(3)))
    item = Item("a", torch.stack([f[1] for f in frames]), torch.stack([f[0] for f in frames]))
    levels = FirstLevels.fit([item], pitch, semantic=True, iters=3)
    codes = levels.codes(item)
    assert codes.shape == (2, len(frames)) and (codes[0] == 0).all()
    decoded = levels.latent(codes)
    # each frame gets the mean envelope of the frames whose states fell in its cluster: never the other kind's
    assert (decoded[0::2, 1] - 1.0).abs().max() < 0.1 and (decoded[1::2, 1] - 3.0).abs().max() < 0.1


def test_the_regression_learns_an_envelope_from_units_and_keeps_the_true_pitch():
    torch.manual_seed(0)
    units = torch.randint(4, (200,))
    latent = torch.stack([torch.randn(200), units.float(), -units.float()], 1)  # [T, D]: pitch, envelope
    model = Regression(3, 1, {"unit": 4}, width=32, layers=2)
    before = (regress(model, {"unit": units}, latent)[:, 1:] - latent[:, 1:]).pow(2).mean()
    train_regression(model, [({"unit": units}, latent)], steps=100, seed=0, window=32, batch=8, lr=1e-2)
    out = regress(model, {"unit": units}, latent)
    assert torch.equal(out[:, 0], latent[:, 0])
    assert (out[:, 1:] - latent[:, 1:]).pow(2).mean() < 0.1 * before
