"""Token windows for LM training: splits by file, windows and masks, the resumable stream."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lm.data import (StreamPosition, TokenDataModule, TokenFiles, TrainWindowStream, ValidWindows, hash_fraction,
                     select_split)
from rvqlm_core.shard_writer import write_token_corpus
from rvqlm_core.token_shards import TokenShards

FINGERPRINT = "5a" * 32


def codec_meta(n_codebooks: int = 3, codebook_size: int = 16, fingerprint: str = FINGERPRINT) -> dict:
    return dict(fingerprint=fingerprint, n_codebooks=n_codebooks, codebook_size=codebook_size, frame_rate=50.0,
                sample_rate=16000, codec_config={"synthetic": True})


def learnable_tokens(n_frames: int, rng: np.random.Generator, codebook_size: int = 16) -> np.ndarray:
    """[n_frames, 3] tokens with structure a small LM learns in a few steps.

    Codebook 0 walks by a per-file stride (10 % random jumps); codebook 1 is a fixed function of
    codebook 0 in the same frame; codebook 2 mixes codebook 1 with the previous frame's codebook 0.
    """
    v = codebook_size
    stride = int(rng.integers(1, 4))
    c0 = np.empty(n_frames, dtype=np.int64)
    c0[0] = rng.integers(v)
    for t in range(1, n_frames):
        c0[t] = rng.integers(v) if rng.random() < 0.1 else (c0[t - 1] + stride) % v
    c1 = (3 * c0 + 1) % v
    c2 = (c1 + np.roll(c0, 1)) % v
    return np.stack([c0, c1, c2], axis=1)


def make_token_corpus(out: Path, n_train: int = 18, n_valid: int = 6, seed: int = 0,
                      fingerprint: str = FINGERPRINT, lengths: tuple[int, int] = (10, 120)) -> TokenShards:
    """A synthetic token folder laid out like the built-in corpus (train/ and valid/ prefixes)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for i in range(n_train + n_valid):
        split = "train" if i < n_train else "valid"
        arrays[f"{split}/level{i % 4}/f{i:03d}.wav"] = learnable_tokens(int(rng.integers(*lengths)), rng)
    return write_token_corpus(out, arrays, codec_meta(fingerprint=fingerprint), shard_frames=500)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tokens") / "tok"
    make_token_corpus(out)
    return out


# ---- splits -----------------------------------------------------------------------------------------

def test_prefix_split_follows_the_corpus_folders():
    paths = ["train/a/1.wav", "valid/b/2.wav", "test/c/3.wav", "train/a/4.wav", "validation/x.wav"]
    assert select_split(paths, "train") == [0, 3]
    assert select_split(paths, "valid") == [1]
    assert select_split(paths, "test") == [2]
    with pytest.raises(ValueError, match="no token files under 'valid/'"):
        select_split(["a.wav", "b.wav"], "valid")


def test_hash_split_is_by_file_deterministic_and_stable_when_files_are_added():
    paths = [f"speaker{i % 7}/take{i}.flac" for i in range(400)] + ["test/held.wav"]
    valid = select_split(paths, "valid", "hash", 0.2)
    train = select_split(paths, "train", "hash", 0.2)
    assert set(valid).isdisjoint(train)
    assert len(valid) + len(train) == 400  # test/ is in neither
    assert 40 < len(valid) < 120  # about 20 % of 400
    assert valid == select_split(list(paths), "valid", "hash", 0.2)
    # Adding files never moves an existing file between splits.
    more = paths + [f"new/{i}.wav" for i in range(100)]
    assert [i for i in select_split(more, "valid", "hash", 0.2) if i < len(paths)] == valid
    assert all(hash_fraction(paths[i]) < 0.2 for i in valid)
    with pytest.raises(ValueError, match="valid_fraction"):
        select_split(paths, "valid", "hash", 1.5)


def test_token_files_of_split_hold_only_that_splits_files(tokens):
    shards = TokenShards.open(tokens)
    valid = TokenFiles.of_split(tokens, "valid")
    train = TokenFiles.of_split(tokens, "train")
    assert len(valid) == 6 and len(train) == 18
    assert all(p.startswith("valid/") for p in valid.relpaths)
    assert all(p.startswith("train/") for p in train.relpaths)
    assert valid.n_frames == tuple(shards.entries[i].n_frames for i in valid.entry_indices)


# ---- training windows -------------------------------------------------------------------------------

def stream(files: TokenFiles, **kw) -> TrainWindowStream:
    args = dict(n_codebooks=3, window_frames=48, batch_size=4, batches_per_epoch=5, seed=7)
    args.update(kw)
    return TrainWindowStream(files, **args)


def test_training_windows_are_file_slices_and_short_files_are_padded_and_masked(tokens):
    shards = TokenShards.open(tokens)
    files = TokenFiles.of_split(tokens, "train")
    s = stream(files)
    seen_short = seen_long = 0
    for b in range(5):
        batch = s.batch(b)
        assert batch["codes"].shape == (4, 3, 48) and batch["codes"].dtype == torch.int64
        assert batch["frame_mask"].shape == (4, 48) and batch["frame_mask"].dtype == torch.bool
        for j in range(4):
            entry_index, start, length = s.sample_span(b * 4 + j)
            entry = shards.entries[entry_index]
            assert entry_index in files.entry_indices
            assert 0 <= start and start + length <= entry.n_frames
            expected = torch.from_numpy(np.asarray(shards.read(entry, start, length), dtype=np.int64)).T
            mask = batch["frame_mask"][j]
            assert int(mask.sum()) == length and bool(mask[:length].all())  # padding only at the end
            assert torch.equal(batch["codes"][j, :, :length], expected)
            assert bool((batch["codes"][j, :, length:] == 0).all())
            if entry.n_frames < 48:
                assert length == entry.n_frames and start == 0
                seen_short += 1
            else:
                assert length == 48
                seen_long += 1
    assert seen_short > 0 and seen_long > 0  # the corpus has both kinds of files


def test_training_stream_is_reproducible_and_ranks_share_out_one_global_batch(tokens):
    files = TokenFiles.of_split(tokens, "train")
    one = stream(files, batch_size=4)
    again = stream(files, batch_size=4)
    other_seed = stream(files, batch_size=4, seed=8)
    assert torch.equal(one.batch(3)["codes"], again.batch(3)["codes"])
    assert not torch.equal(one.batch(3)["codes"], other_seed.batch(3)["codes"])
    assert not torch.equal(one.batch(3)["codes"], one.batch(4)["codes"])
    # Two ranks with batch 2 see exactly the windows one rank with batch 4 sees, split in two.
    r0, r1 = (stream(files, batch_size=2, rank=r, world_size=2) for r in (0, 1))
    for b in range(3):
        joined = torch.cat([r0.batch(b)["codes"], r1.batch(b)["codes"]])
        assert torch.equal(joined, one.batch(b)["codes"])


def test_training_stream_starts_at_its_position_and_ends_with_the_epoch(tokens):
    files = TokenFiles.of_split(tokens, "train")
    full = [b["batch_index"].item() for b in stream(files)]
    assert full == [0, 1, 2, 3, 4]
    pos = StreamPosition(7)  # 2 batches into the second epoch
    resumed = list(stream(files, position=pos))
    assert [b["batch_index"].item() for b in resumed] == [7, 8, 9]
    assert torch.equal(resumed[0]["codes"], stream(files).batch(7)["codes"])


def test_worker_processes_yield_the_same_batches_in_the_same_order(tokens):
    files = TokenFiles.of_split(tokens, "train")
    s = stream(files, batches_per_epoch=6)
    serial = list(DataLoader(s, batch_size=None, num_workers=0))
    parallel = list(DataLoader(s, batch_size=None, num_workers=2))
    assert [b["batch_index"].item() for b in parallel] == list(range(6))
    for a, b in zip(serial, parallel):
        assert torch.equal(a["codes"], b["codes"]) and torch.equal(a["frame_mask"], b["frame_mask"])


# ---- validation windows -----------------------------------------------------------------------------

def test_validation_windows_cover_every_held_out_frame_once_and_are_deterministic(tokens):
    shards = TokenShards.open(tokens)
    valid = TokenFiles.of_split(tokens, "valid")
    windows = ValidWindows(valid, 3, window_frames=32, batch_size=3)
    batches = list(windows)
    assert sum(int(b["frame_mask"].sum()) for b in batches) == valid.total_frames
    # Reassemble each file from its windows: exactly its tokens, in order.
    rebuilt = {i: [] for i in valid.entry_indices}
    flat = [(b["codes"][j], b["frame_mask"][j]) for b in batches for j in range(b["codes"].shape[0])]
    assert len(flat) == len(windows.spans)
    for (entry_index, start, length), (codes, mask) in zip(windows.spans, flat):
        assert int(mask.sum()) == length
        rebuilt[entry_index].append(codes[:, :length])
    for i, parts in rebuilt.items():
        expected = np.asarray(shards.read(shards.entries[i]), dtype=np.int64).T
        assert torch.equal(torch.cat(parts, dim=1), torch.from_numpy(expected))
    again = list(ValidWindows(valid, 3, window_frames=32, batch_size=3))
    assert all(torch.equal(a["codes"], b["codes"]) for a, b in zip(batches, again))


def test_validation_windows_are_partitioned_between_ranks(tokens):
    valid = TokenFiles.of_split(tokens, "valid")
    whole = ValidWindows(valid, 3, 20, 2).spans
    parts = [ValidWindows(valid, 3, 20, 2, rank=r, world_size=3).spans for r in range(3)]
    assert sorted(s for p in parts for s in p) == sorted(whole)
    capped = ValidWindows(valid, 3, 20, 2, max_windows=5).spans
    assert len(capped) == 5 and set(capped) <= set(whole)


# ---- the DataModule ---------------------------------------------------------------------------------

def test_datamodule_reads_the_token_layout_and_checkpoints_its_position(tokens):
    dm = TokenDataModule(str(tokens), window_frames=40, batch_size=2, batches_per_epoch=4)
    assert (dm.n_codebooks, dm.codebook_size, dm.codec_fingerprint, dm.frame_rate) == (3, 16, FINGERPRINT, 50.0)
    loader = dm.train_dataloader()
    assert len(loader) == 4
    dm.position.consumed_batches = 6
    state = dm.state_dict()
    fresh = TokenDataModule(str(tokens), window_frames=40, batch_size=2, batches_per_epoch=4)
    fresh.load_state_dict(state)
    assert [b["batch_index"].item() for b in fresh.train_dataloader()] == [6, 7]
    changed = TokenDataModule(str(tokens), window_frames=40, batch_size=3, batches_per_epoch=4)
    with pytest.raises(ValueError, match="batch_size: checkpoint 2, now 3"):
        changed.load_state_dict(state)


def test_datamodule_errors_are_clear(tmp_path, tokens):
    with pytest.raises(FileNotFoundError, match="rvqlm tokenize"):
        TokenDataModule(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="split_by=hash"):
        flat = tmp_path / "flat"
        write_token_corpus(flat, {"a.wav": np.zeros((20, 3), np.int64)}, codec_meta())
        TokenDataModule(str(flat))


def test_sample_weights_draw_files_in_proportion_to_weight_times_frames(tokens):
    """lm.data's module docstring: a file is drawn in proportion to its frames, times its group's weight."""
    dm = TokenDataModule(str(tokens), window_frames=48, batch_size=4, sample_weights={"train/level0/*": 3.0,
                                                                                       "train/level1/*": 0.0})
    files = dm.train_files
    weights = np.array(dm.train_weights)
    assert set(weights[[r.startswith("train/level0/") for r in files.relpaths]]) == {3.0}
    assert set(weights[[r.startswith("train/level1/") for r in files.relpaths]]) == {0.0}
    assert set(weights[[r[:13] in ("train/level2/", "train/level3/") for r in files.relpaths]]) == {1.0}
    s = stream(files, weights=dm.train_weights)
    draws = np.array([files.entry_indices.index(s.sample_span(i)[0]) for i in range(4000)])
    expected = weights * np.array(files.n_frames)
    expected = expected / expected.sum()
    seen = np.bincount(draws, minlength=len(files)) / len(draws)
    assert seen[weights == 0].sum() == 0
    assert np.abs(seen - expected).max() < 0.025  # 4,000 draws: se of a share <= 0.008
    unweighted = stream(files)
    plain = np.array([files.entry_indices.index(unweighted.sample_span(i)[0]) for i in range(4000)])
    assert (plain[:, None] == np.flatnonzero(weights == 0)[None]).any(1).mean() > 0.1  # level1 drawn unweighted


def test_sample_weights_are_checked_and_a_resume_must_keep_them(tokens):
    with pytest.raises(ValueError, match="matches no training file"):
        TokenDataModule(str(tokens), sample_weights={"train/synth-*": 0.5})
    with pytest.raises(ValueError, match=">= 0"):
        TokenDataModule(str(tokens), sample_weights={"train/*": -1.0})
    with pytest.raises(ValueError, match="every training file weight 0"):
        TokenDataModule(str(tokens), sample_weights={"train/*": 0.0})
    state = TokenDataModule(str(tokens), sample_weights={"train/level0/*": 2.0}).state_dict()
    with pytest.raises(ValueError, match="sample_weights"):
        TokenDataModule(str(tokens), sample_weights={"train/level0/*": 3.0}).load_state_dict(state)
    TokenDataModule(str(tokens), sample_weights={"train/level0/*": 2.0}).load_state_dict(state)
    with pytest.raises(ValueError, match="sample_weights"):
        TokenDataModule(str(tokens), sample_weights={"train/level0/*": 2.0}).load_state_dict(
            TokenDataModule(str(tokens)).state_dict())
