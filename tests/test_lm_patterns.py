"""Codebook interleaving patterns (lm/patterns.py): build / revert / validity."""

from __future__ import annotations

import pytest
import torch

from lm.patterns import DelayPattern, ParallelPattern, get_pattern

FILL = 99


@pytest.mark.parametrize("n_codebooks,n_frames", [(1, 5), (3, 4), (8, 37)])
def test_delay_build_revert_is_exact_inverse(n_codebooks, n_frames):
    """Issue 4: the delay pattern's build/revert is an exact inverse (MusicGen delay, codebook k shifted k steps)."""
    pattern = get_pattern("delay", n_codebooks)
    codes = torch.randint(0, 50, (2, n_codebooks, n_frames))
    seq, valid = pattern.build(codes, None, FILL)
    assert seq.shape == valid.shape == (2, n_codebooks, n_frames + n_codebooks - 1)
    assert pattern.sequence_length(n_frames) == n_frames + n_codebooks - 1
    assert torch.equal(pattern.revert(seq), codes)


def test_delay_layout_and_invalid_positions_by_hand():
    """The delay layout of lm/patterns.py's diagram: step s of codebook k holds frame s - k; the rest is invalid."""
    pattern = DelayPattern(3)
    codes = torch.tensor([[[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]]])
    seq, valid = pattern.build(codes, None, FILL)
    f = FILL
    assert seq[0].tolist() == [[10, 11, 12, 13, f, f],
                               [f, 20, 21, 22, 23, f],
                               [f, f, 30, 31, 32, 33]]
    assert valid[0].tolist() == [[1, 1, 1, 1, 0, 0],
                                 [0, 1, 1, 1, 1, 0],
                                 [0, 0, 1, 1, 1, 1]]
    assert torch.equal(pattern.valid(4), valid[0])


def test_delay_padding_frames_are_invalid_at_their_shifted_steps():
    """Seed 000: padding is left out of the loss, so a padded frame is invalid in every codebook (at step t + k)."""
    pattern = DelayPattern(3)
    codes = torch.randint(0, 50, (2, 3, 5))
    frame_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    seq, valid = pattern.build(codes, frame_mask, FILL)
    assert torch.equal(valid[0], pattern.valid(5))
    for k in range(3):
        frames_valid = [k <= s < k + 3 for s in range(7)]
        assert valid[1, k].tolist() == frames_valid
    assert (seq[~valid] == FILL).all()
    assert torch.equal(pattern.revert(seq)[0], codes[0])
    assert torch.equal(pattern.revert(seq)[1, :, :3], codes[1, :, :3])


def test_parallel_pattern_is_the_identity():
    """The parallel pattern keeps frames as they are: S = T, every position valid."""
    pattern = ParallelPattern(4)
    codes = torch.randint(0, 50, (3, 4, 9))
    seq, valid = pattern.build(codes, None, FILL)
    assert torch.equal(seq, codes) and valid.all()
    assert pattern.sequence_length(9) == 9
    assert torch.equal(pattern.revert(seq), codes)


def test_num_frames_inverts_sequence_length():
    for pattern in (DelayPattern(8), ParallelPattern(8)):
        for t in (1, 2, 100):
            assert pattern.num_frames(pattern.sequence_length(t)) == t


def test_bad_input_is_refused_clearly():
    with pytest.raises(ValueError, match="unknown codebook pattern"):
        get_pattern("zigzag", 4)
    pattern = DelayPattern(4)
    with pytest.raises(ValueError, match=r"\[B, 4, T\]"):
        pattern.build(torch.zeros(2, 3, 5, dtype=torch.long), None, FILL)
    with pytest.raises(ValueError, match="frame_mask"):
        pattern.build(torch.zeros(2, 4, 5, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool), FILL)
