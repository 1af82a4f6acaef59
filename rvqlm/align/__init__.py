"""The forced aligner (issue 47): a small CTC model over log-mel frames, one per codec token frame,
trained on a corpus's own lines, and `torchaudio.functional.forced_align` over its log-probs, which
places each line's text units (lm/text_units.py) on the 20 ms frames as per-unit durations."""
