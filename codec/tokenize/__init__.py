"""Tokenizing folders of audio into token shards: one process (folder.py) or many (distributed.py)."""
