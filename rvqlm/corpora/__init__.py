"""The corpora: each a module that prepares one (fillets with its dialog scripts, voices, synthetic),
the generic folder writer they share (folder.py), and transcripts as text tokens."""
