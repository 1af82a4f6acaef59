"""The built-in corpus: real speech, split by level, test split disjoint from training."""

from rvqlm.corpus import list_source_files, split_of_level


def test_split_is_by_level_and_disjoint(speech_files, corpus_dir):
    levels = {s: {p.parent.name for p in files} for s, files in speech_files.items()}
    assert levels["train"] and levels["valid"] and levels["test"]
    assert not (levels["train"] & levels["valid"]) and not (levels["train"] & levels["test"])
    assert not (levels["valid"] & levels["test"])
    assert len(speech_files["train"]) > 5 * len(speech_files["test"])


def test_split_rule_is_deterministic():
    assert [split_of_level(i) for i in range(10)].count("train") == 8
    files = list_source_files()
    assert files == list_source_files()
